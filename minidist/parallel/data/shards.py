"""The loss weight that makes the shards' gradients add up to the full-batch gradient (see
data_parallel.py). Which slice of the global batch a rank takes is minidist.split's rule:
split_range(B, P, rank); the layers backward runs one by one are the step runner's units
(``leaf_layers``, minidist.nn.runner.units); the clock's charges are parallel/clock.py's."""

from __future__ import annotations

import numpy as np

from minidist.nn.runner import units as leaf_layers
from minidist.split import split_range

__all__ = ["ShardWeightedLoss", "leaf_layers", "shard_range"]


def shard_range(comm, x: np.ndarray, y: np.ndarray) -> tuple[int, int]:
    """[lo, hi) of this rank's contiguous slice of the global batch x (B, ...), y (B, ...); P <= B."""
    if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)) or x.ndim < 1 or len(x) != len(y):
        raise ValueError(f"expected arrays x and y with the same first (batch) dimension, got "
                         f"{getattr(x, 'shape', type(x).__name__)} and "
                         f"{getattr(y, 'shape', type(y).__name__)}")
    if len(x) < comm.world_size:
        raise ValueError(f"a global batch of {len(x)} examples cannot be split over {comm.world_size} ranks: "
                         f"data parallelism needs P <= B (at least one example per rank)")
    return split_range(len(x), comm.world_size, comm.rank)


class ShardWeightedLoss:
    """A loss whose backward is scaled by ``weight`` = n_r / B: the gradient of Σ_{i∈r} ℓ_i / B."""

    def __init__(self, loss_fn, weight: float):
        self.loss_fn, self.weight = loss_fn, weight

    def forward(self, logits: np.ndarray, target: np.ndarray) -> float:
        """logits: the shard's outputs, (n_r, ...); target: its targets, (n_r, ...). Returns the mean loss."""
        return self.loss_fn.forward(logits, target)

    def backward(self) -> np.ndarray:
        """Returns weight · dloss/dlogits, shape (n_r, ...) like the logits."""
        grad = self.loss_fn.backward()
        return grad if self.weight == 1.0 else grad * self.weight
