"""Gradient buckets for data parallelism, as PyTorch's DistributedDataParallel forms them.

Allreducing every gradient tensor on its own costs one latency α per tensor and per algorithm step; one
allreduce of the whole model must wait until the *last* gradient (the first layer's) is ready, so nothing
overlaps the backward pass. Buckets sit in between: the gradients are taken in *reverse* parameter order
(the order backward produces them) and packed into buckets of about ``bucket_bytes``; each bucket is one
allreduce of one flat buffer, issued as soon as its last gradient is ready.

    parameters (forward order):   W1 b1 | W2 b2 | W3 b3
    reverse:                      b3 W3 b2 W2 b1 W1
    bucket_bytes = |b3 W3|:       [b3 W3] [b2 W2] [b1 W1]        bucket 0 is ready after layer 3's backward

A bucket is closed as soon as it holds at least ``bucket_bytes`` (so a parameter larger than the cap gets a
bucket of its own), as DDP's ``compute_bucket_assignment_by_size`` does. ``bucket_bytes=None`` means no
bucketing: one allreduce per parameter. (DDP also makes its first bucket small, 1 MiB, to start
communicating early; we keep one cap for all buckets.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minidist.checks import is_count
from minidist.collectives import allreduce
from minidist.nn.module import Parameter

DEFAULT_BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb = 25


@dataclass
class Bucket:
    """Parameters whose gradients travel together in one allreduce (reverse parameter order)."""

    index: int
    params: list[Parameter]
    buffer: np.ndarray | None = None      # the flat scratch buffer, allocated at the first allreduce

    @property
    def nbytes(self) -> int:
        return sum(p.grad.nbytes for p in self.params)

    @property
    def size(self) -> int:
        return sum(p.size for p in self.params)


def assign_buckets(params: list[Parameter], bucket_bytes: int | None) -> list[Bucket]:
    """Pack ``params`` (in forward order) into buckets, filled in reverse order; see the module docstring."""
    if bucket_bytes is not None and not is_count(bucket_bytes):
        raise ValueError("bucket_bytes must be a positive int (bytes) or None (no bucketing), got "
                         f"{bucket_bytes!r}")
    buckets: list[Bucket] = []
    current: list[Parameter] = []
    for p in reversed(params):
        current.append(p)
        if bucket_bytes is None or sum(q.grad.nbytes for q in current) >= bucket_bytes:
            buckets.append(Bucket(len(buckets), current))
            current = []
    if current:
        buckets.append(Bucket(len(buckets), current))
    return buckets


def ready_layers(layers: list, buckets: list[Bucket]) -> list[int]:
    """For each bucket, the index of the layer whose backward completes it (its smallest layer index:
    backward runs from the last layer to the first)."""
    layer_of = {id(p): i for i, layer in enumerate(layers) for p in layer.parameters()}
    missing = [p for b in buckets for p in b.params if id(p) not in layer_of]
    if missing:
        raise ValueError(f"{len(missing)} parameter(s) belong to none of the layers")
    return [min(layer_of[id(p)] for p in b.params) for b in buckets]


def allreduce_bucket(comm, grads: list[np.ndarray], algorithm: str = "ring",
                     buffer: np.ndarray | None = None) -> None:
    """Sum one bucket of gradients over all ranks with ONE allreduce, writing the sums back in place.

    grads: the bucket's gradient arrays (any shapes, one dtype), the same shapes on every rank.
    buffer: optional 1-D scratch array of sum(g.size) elements and the gradients' dtype, reused from step
    to step (a fresh large array costs page faults every time).
    Flatten the gradients into one buffer, ``allreduce(comm, flat, op="sum", algorithm=algorithm,
    out=flat)`` it in place, and copy each piece of the sum back into its gradient. Data parallelism weights
    every rank's gradient by n_r / B before calling this, so the sum is the full-batch average:
    g = Σ_r (n_r / B) g_r.
    """
    # BEGIN SOLUTION dp_bucketed_allreduce
    flat = np.concatenate([g.ravel() for g in grads], out=buffer)
    allreduce(comm, flat, op="sum", algorithm=algorithm, out=flat)
    offset = 0
    for g in grads:
        g[...] = flat[offset:offset + g.size].reshape(g.shape)
        offset += g.size
    # END SOLUTION


def allreduce_gradients(comm, params: list[Parameter], algorithm: str = "ring") -> None:
    """Sum every parameter's gradient over ``comm``, in place, all of them as ONE bucket (one allreduce):
    the hybrids' data-parallel step (hybrid.py, grid3d.py, grid_spatial.py). The same bytes as one
    allreduce per parameter, 2(D−1)/D·|W| per rank on the ring, in far fewer messages."""
    if comm.world_size == 1 or not params:
        return
    dtypes = {p.grad.dtype for p in params}
    if len(dtypes) > 1:
        raise TypeError("allreduce_gradients: the parameters must share one dtype, got "
                        f"{sorted(map(str, dtypes))}")
    allreduce_bucket(comm, [p.grad for p in params], algorithm)
