"""SyncBatchNorm: batch normalisation whose statistics span the global batch of all ranks (torch's name).

Under data parallelism each rank holds n_r of the M = Σ_r n_r values of a channel. The "Hardware
Accelerators for Training Deep Neural Networks" slides ("Batch Normalization") normalise with the mean
and variance of the *whole* mini-batch; one allreduce per forward gives them:

    forward:  (M, S₁, S₂) = allreduce_r (n_r, Σ x, Σ x²)      (1 + 2C values, in float64)
              μ = S₁ / M,   σ² = S₂ / M − μ²,   x̂ = (x − μ) / √(σ² + ε),   y = γ x̂ + β
    backward: (D₁, D₂) = allreduce_r (Σ dy, Σ dy·x̂)           (2C values)
              dx = γ/√(σ² + ε) · (dy − D₁/M − x̂ · D₂/M)
              dγ += Σ_r-local dy·x̂,  dβ += Σ_r-local dy        (DataParallel's gradient allreduce sums them)

Why sums, not a Welford merge: a sum-allreduce works with every algorithm and costs one message of
1 + 2C numbers. Its weakness, S₂/M − μ² cancelling when |μ| ≫ σ, is tamed by summing in float64 (it
loses about log10(μ²/σ²) of 16 digits); a Welford/Chan merge of (n_r, mean_r, M2_r) is exact-er but is
not a sum, so it needs an allgather of P·(2C+1) numbers and a merge in rank order.

An empty shard sends (0, 0, 0) and still joins both allreduces; M ≤ 1 is a ValueError on every rank.
Running statistics are updated from the allreduced (μ, σ²·M/(M−1)), so they are bitwise the same on
every rank. In eval mode it is plain BatchNorm with the running estimates (no communication).
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import ALGORITHMS, allreduce
from minidist.nn.module import Module, Sequential
from minidist.nn.norm import BatchNorm1d, BatchNorm2d, _BatchNorm

from .shards import check_communicator

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm"]


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation over the global batch of ``comm``'s ranks; input (N, C), (N, C, L) or (N, C, H, W).

    num_features, eps, momentum, affine, dtype: as BatchNorm1d/2d. comm: the Communicator of the ranks
    sharing the batch (keyword-only, torch's process_group). algorithm: the allreduce's. N may be 0.
    """

    expected_ndim = (2, 3, 4)
    #: False: dγ, dβ are this rank's partial sums (data parallelism allreduces them later);
    #: True: they are the global sums (SpatialBatchNorm2d, whose parameters get no other allreduce).
    global_parameter_gradients = False

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 *, comm, algorithm: str = "ring", dtype=np.float32):
        check_communicator("comm", comm, optional=False)
        if algorithm != "auto" and algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)} or 'auto', got {algorithm!r}")
        super().__init__(num_features, eps, momentum, affine, dtype=dtype)
        self.comm, self.algorithm = comm, algorithm

    def _allreduce(self, values: np.ndarray) -> np.ndarray:
        return allreduce(self.comm, values, op="sum", algorithm=self.algorithm)

    def _statistics(self, x: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray, int]:
        """forward is BatchNorm's (minidist/nn/norm.py) on this rank's shard x, (n_r, C, *) with n_r ≥ 0;
        in training its (μ, σ², M) come from one allreduce of (M, S₁, S₂): μ, σ² (C,) in float64."""
        wide = x.astype(np.float64)                          # sums in float64 (see the module docstring)
        local = np.concatenate([[x.size // self.num_features], wide.sum(axis=self._axes),
                                (wide * wide).sum(axis=self._axes)])
        total = self._allreduce(local)
        count = int(total[0])
        if count < 2:
            raise ValueError(f"{what}: training needs more than 1 value per channel over all "
                             f"{self.comm.world_size} ranks, got {count} (every shard empty?)")
        self._count = count
        mean = total[1:1 + self.num_features] / count
        return mean, np.maximum(total[1 + self.num_features:] / count - mean * mean, 0.0), count

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient of this rank's output, shape (n_r, C, *); returns dx, shape (n_r, C, *).
        Adds dγ, dβ (C,) into weight.grad, bias.grad (local sums, or global if global_parameter_gradients).
        With batch statistics: one allreduce of 2C values."""
        self.check_upstream(dy)
        # BEGIN SOLUTION sync_batchnorm_backward
        # BEGIN PROMPT
        # Hint: sum dy and dy·x̂ over every axis but the channels on this rank, allreduce the 2C sums
        # (self._allreduce), then dx = inv_std·(g − D₁·γ/M − x̂·D₂·γ/M) with g = dy·γ and M = self._count.
        # An empty shard still joins the allreduce. Which sums go into weight.grad / bias.grad depends
        # on self.global_parameter_gradients.
        # END PROMPT
        C, x_hat, axes = self.num_features, self._x_hat, self._axes
        local = np.concatenate([dy.sum(axis=axes), (dy * x_hat).sum(axis=axes)])   # Σ dy, Σ dy·x̂
        need_total = self._batch_statistics or self.global_parameter_gradients
        total = self._allreduce(local) if need_total else local
        gamma = np.ones(C, dtype=dy.dtype) if self.weight is None else self.weight.data
        if self.weight is not None:
            sums = total if self.global_parameter_gradients else local
            self.weight.grad += sums[C:]
            self.bias.grad += sums[:C]
        g = dy * self._per_channel(gamma, dy.ndim)                                     # dL/dx̂
        if not self._batch_statistics:            # running statistics are constants
            return g * self._inv_std
        g_mean = self._per_channel(gamma * total[:C] / self._count, dy.ndim)          # path through μ
        gx_mean = self._per_channel(gamma * total[C:] / self._count, dy.ndim)         # path through σ²
        return self._inv_std * (g - g_mean - x_hat * gx_mean)
        # END SOLUTION

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.weight is not None}, world_size={self.comm.world_size})")


def _adopt(sync: _BatchNorm, bn: _BatchNorm) -> _BatchNorm:
    """Make ``sync`` share bn's Parameters and running buffers (the same arrays) and its mode."""
    sync.weight, sync.bias = bn.weight, bn.bias
    sync.register_buffer("running_mean", bn.running_mean)
    sync.register_buffer("running_var", bn.running_var)
    sync.training = bn.training
    return sync


def convert_sync_batchnorm(model: Module, comm, algorithm: str = "ring") -> Module:
    """Replace every BatchNorm1d/2d in ``model`` (a Sequential, nested ones included, or a single
    BatchNorm) by a SyncBatchNorm sharing its weight, bias and running statistics (torch's
    ``SyncBatchNorm.convert_sync_batchnorm``). Sequentials are changed in place; returns the model."""
    if isinstance(model, (BatchNorm1d, BatchNorm2d)):
        sync = SyncBatchNorm(model.num_features, model.eps, model.momentum, model.weight is not None,
                             comm=comm, algorithm=algorithm, dtype=model.running_mean.dtype)
        return _adopt(sync, model)
    if isinstance(model, Sequential):
        model.layers = [convert_sync_batchnorm(layer, comm, algorithm) for layer in model.layers]
        return model
    for child in model.children():
        if isinstance(child, (BatchNorm1d, BatchNorm2d)):
            raise TypeError(f"convert_sync_batchnorm converts BatchNorm layers inside Sequentials; "
                            f"{type(model).__name__} holds one as an attribute")
        convert_sync_batchnorm(child, comm, algorithm)
    return model
