"""What every data-parallel trainer shares: the checks of its arguments, the slice of the global batch a
rank takes (collectives.pieces's rule: split_range(B, P, rank)) and the loss weight that makes the shards'
gradients add up to the full-batch gradient (see data/naive.py)."""

from __future__ import annotations

import numpy as np

from minidist.collectives.pieces import split_range
from minidist.nn.module import Module, Parameter


def check_communicator(name: str, comm, *, optional: bool = True) -> None:
    """TypeError unless comm is a Communicator (has rank and world_size), or None where optional."""
    if comm is None and optional:
        return
    if not (hasattr(comm, "rank") and hasattr(comm, "world_size")):
        raise TypeError(f"{name} must be a Communicator{' or None' if optional else ''}, got "
                        f"{type(comm).__name__}")


def check_trainer(comm, model, loss_fn) -> list[Parameter]:
    """The checks every data-parallel trainer makes before it changes anything: a Communicator, a minidist
    Module with parameters, all of one dtype, and a loss with forward and backward. Returns the parameters."""
    check_communicator("comm", comm, optional=False)
    if not isinstance(model, Module):
        raise TypeError(f"model must be a minidist Module, got {type(model).__name__}")
    if not (callable(getattr(loss_fn, "forward", None)) and callable(getattr(loss_fn, "backward", None))):
        raise TypeError("loss_fn must have forward(logits, target) and backward(), got "
                        f"{type(loss_fn).__name__}")
    params = model.parameters()
    if not params:
        raise ValueError("model has no parameters: nothing to train data-parallel")
    dtypes = sorted({str(p.data.dtype) for p in params})
    if len(dtypes) > 1:
        raise TypeError(f"all parameters must share one dtype, got {dtypes}")
    return params


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
    """A loss whose backward is scaled by ``weight`` = n_r / B: the gradient of Σ_{i∈r} ℓ_i / B.

    scale_forward: forward returns weight · the mean loss too (the rank's share of the global objective,
    which parallelize's ranks sum); else the shard's own mean loss (DataParallel averages those itself).
    """

    def __init__(self, loss_fn, weight: float, *, scale_forward: bool = False):
        self.loss_fn, self.weight, self.scale_forward = loss_fn, weight, bool(scale_forward)

    def forward(self, logits: np.ndarray, target: np.ndarray) -> float:
        """logits: the shard's outputs, (n_r, ...); target: its targets, (n_r, ...). Returns the mean loss
        (scale_forward: weight · it)."""
        loss = self.loss_fn.forward(logits, target)
        return self.weight * loss if self.scale_forward else loss

    def backward(self) -> np.ndarray:
        """Returns weight · dloss/dlogits, shape (n_r, ...) like the logits."""
        grad = self.loss_fn.backward()
        return grad if self.weight == 1.0 else grad * self.weight
