"""SpatialBatchNorm2d: BatchNorm2d over images split across a grid of ranks (each holds a block of H×W).

A channel's statistics run over N·H·W values, of which rank r holds N·h_r·w_r. It is the same sum as
SyncBatchNorm's ("Hardware Accelerators for Training Deep Neural Networks" slides, "Batch Normalization"),
only the split runs across the image instead of across the batch:

    forward:  (M, S₁, S₂) = allreduce_r (N·h_r·w_r, Σ x, Σ x²)     μ = S₁/M,  σ² = S₂/M − μ²
    backward: (D₁, D₂) = allreduce_r (Σ dy, Σ dy·x̂)                dx = γ/√(σ²+ε)·(dy − D₁/M − x̂·D₂/M)
              dβ += D₁,  dγ += D₂      (the global sums: spatial ranks share one set of parameters and,
                                         unlike data parallelism, allreduce no gradients afterwards)

So the backward's one allreduce serves both dx and the parameter gradients. No halo is needed: the
layer is element-wise once (μ, σ²) are known. ``spatialize`` maps every BatchNorm2d to this layer.
"""

from __future__ import annotations

from minidist.nn.norm import BatchNorm2d
from minidist.parallel.sync_batchnorm import SyncBatchNorm, _adopt

__all__ = ["SpatialBatchNorm2d"]


class SpatialBatchNorm2d(SyncBatchNorm):
    """BatchNorm2d on this rank's block (N, C, h, w) with statistics over the whole (N, C, H, W) image.

    bn: the single-process BatchNorm2d (its weight, bias and running statistics are shared, not copied);
    comm: the grid's Communicator; algorithm: the allreduce algorithm. forward/backward: (N, C, h, w).
    """

    expected_ndim = (4,)
    global_parameter_gradients = True

    def __init__(self, bn: BatchNorm2d, comm, algorithm: str = "ring"):
        if not isinstance(bn, BatchNorm2d):
            raise TypeError(f"SpatialBatchNorm2d wraps a BatchNorm2d, got {type(bn).__name__}")
        super().__init__(bn.num_features, bn.eps, bn.momentum, bn.weight is not None, comm=comm,
                         algorithm=algorithm, dtype=bn.running_mean.dtype)
        _adopt(self, bn)
