"""Pieces of data parallelism that need no communication: which layers backward runs one by one,
which slice of the global batch a rank takes, and the loss weight that makes the shards' gradients add
up to the full-batch gradient (see data.py)."""

from __future__ import annotations

import numpy as np

from minidist.nn.module import Module, Sequential


def leaf_layers(model: Module) -> list[Module]:
    """The layers backward runs one by one: a Sequential's layers (nested Sequentials flattened), or
    the model itself."""
    if isinstance(model, Sequential):
        return [leaf for layer in model for leaf in leaf_layers(layer)]
    return [model]


def shard_bounds(batch_size: int, world_size: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of rank's contiguous shard; like np.array_split: the first B mod P ranks get one more."""
    base, extra = divmod(batch_size, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)


class ShardWeightedLoss:
    """A loss whose backward is scaled by ``weight`` = n_r / B: the gradient of Σ_{i∈r} ℓ_i / B."""

    def __init__(self, loss_fn, weight: float):
        self.loss_fn, self.weight = loss_fn, weight

    def forward(self, logits: np.ndarray, target: np.ndarray) -> float:
        return self.loss_fn.forward(logits, target)

    def backward(self) -> np.ndarray:
        grad = self.loss_fn.backward()
        return grad if self.weight == 1.0 else grad * self.weight
