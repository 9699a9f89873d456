"""Gradient buckets for data parallelism, as PyTorch's DistributedDataParallel forms them; when they are
complete during backward (GradientReadiness); one bucket's allreduce (allreduce_bucket).

Allreducing every gradient tensor on its own costs one latency α per tensor and per algorithm step; one
allreduce of the whole model must wait until the *last* gradient (the first layer's) is ready, so nothing
overlaps the backward pass. Buckets sit in between: the gradients are taken in *reverse* parameter order
(the order backward produces them) and packed into buckets of about ``bucket_bytes``; each bucket is one
allreduce of one flat buffer, issued as soon as its last gradient is ready.

    parameters (forward order):   W1 b1 | W2 b2 | W3 b3
    reverse:                      b3 W3 b2 W2 b1 W1
    bucket_bytes = |b3 W3|:       [b3 W3] [b2 W2] [b1 W1]        bucket 0 is ready after layer 3's backward

A bucket is closed as soon as it holds at least ``bucket_bytes`` (so a parameter larger than the cap gets a
bucket of its own), as DDP's ``compute_bucket_assignment_by_size`` does (one cap for all buckets; DDP's
first is 1 MiB). ``bucket_bytes=None`` means no bucketing: one allreduce per parameter.

When is a gradient ready? The step runner's ``after_backward(i, unit, dx)`` says "unit.parameters() have
their gradients". A parameter p held by u_p units (u_p = 2 for a tied weight) is *ready* in the step's
last backward pass (``begin_backward(last=True)``; the passes before it only accumulate, as DDP's
``no_sync``) once the last of those units has run — GradientReadiness, the base of both gradient syncs:

    begin_backward(last)    left_p = u_p for every p
    after_backward(unit)    left_p −= 1 for p in unit;  ready when left_p = 0
    p ready                 p.grad = Σ_c p.grad for c in p.partial_over   (tensor / sequence / context /
                            expert / spatial splits: collectives.partial.sum_partial_gradients)
    bucket ready            all its parameters ready -> bucket_complete(bucket), in bucket order
    end_backward            the parameters not ready yet are summed (an empty pass: a table's W tasks
                            made them), then backward_complete(the buckets that did not complete)

Keyed by parameter, so one attachment serves a whole model's runner and a pipeline stage's (whose units are
another model's): GradientSync (sync.py, with ``allreduce_bucket`` below) and ZeroSync (zero_sync.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minidist.collectives import allreduce
from minidist.collectives.partial import sum_partial_gradients
from minidist.nn.checks import is_count
from minidist.nn.module import Module, Parameter
from minidist.nn.runner import Attachment, units

DEFAULT_BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb = 25


@dataclass
class Bucket:
    """Parameters whose gradients travel together in one allreduce (reverse parameter order)."""

    index: int
    params: list[Parameter]
    buffer: np.ndarray | None = None      # the flat scratch buffer, allocated at the first allreduce
    delayed: bool = False                 # not sent by the data attachment (delayed.py sends it next step)

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


class GradientReadiness(Attachment):
    """The readiness of ``model``'s parameters' gradients (a whole model or a pipeline stage's module; see
    the module docstring); a subclass says what its buckets are (``watch``) and what to do with a ready one
    (``bucket_complete``, ``backward_complete``)."""

    def __init__(self, model: Module):
        if not isinstance(model, Module):
            raise TypeError(f"model must be a minidist Module, got {type(model).__name__}")
        self.model, self.params, self.units = model, model.parameters(), units(model)
        self._uses = {id(p): 0 for p in self.params}            # units a parameter belongs to (tied: 2)
        for unit in self.units:
            for p in unit.parameters():
                self._uses[id(p)] = self._uses.get(id(p), 0) + 1
        self._unit_params: dict[int, list[Parameter]] = {}
        self.buckets: list[Bucket] = []
        self._last = True

    def watch(self, buckets: list[Bucket]) -> None:
        """The buckets whose completion is reported: each parameter in exactly one, ``index`` = position."""
        self.buckets = buckets
        self.bucket_of = {id(p): b for b in buckets for p in b.params}
        self.begin_backward(True)

    def params_of(self, unit: Module) -> list[Parameter]:
        """unit.parameters(), looked up once per unit."""
        found = self._unit_params.get(id(unit))
        if found is None:
            found = self._unit_params[id(unit)] = unit.parameters()
        return found

    # -- the runner's events ---------------------------------------------------------------------------------
    def begin_backward(self, last: bool) -> None:
        self._last = bool(last)
        if self._last:
            self._left = dict(self._uses)
            self._waiting = {b.index: len(b.params) for b in self.buckets}

    def after_backward(self, i, unit, dx):
        """unit's parameters' gradients are ready: sum the partial ones, report the buckets they complete."""
        if not self._last:
            return dx
        ready = []
        for p in self.params_of(unit):
            self._left[id(p)] -= 1
            if self._left[id(p)] == 0:
                ready.append(p)
        self._sum_partial(ready)
        complete = []
        for p in ready:
            bucket = self.bucket_of[id(p)]
            self._waiting[bucket.index] -= 1
            if self._waiting[bucket.index] == 0:
                complete.append(bucket)
        for bucket in sorted(complete, key=lambda b: b.index):     # in bucket order, as DDP issues them
            self.bucket_complete(bucket)
        return dx

    def end_backward(self) -> None:
        """The step's last pass is done: sum what is not summed yet, report the buckets left."""
        if not self._last:
            return
        self._sum_partial([p for p in self.params if self._left[id(p)] > 0])
        self._left = dict.fromkeys(self._left, 0)
        self.backward_complete([b for b in self.buckets if self._waiting[b.index] > 0])

    @staticmethod
    def _sum_partial(params: list[Parameter]) -> None:
        """The partial ones of params summed over their groups, by the one function that does it
        (ZeRO-3: their data is freed by now; only p.grad is read)."""
        partial = [p for p in params if p.partial_over]
        if partial:
            sum_partial_gradients(partial)

    # -- what a subclass does with them ----------------------------------------------------------------------
    def bucket_complete(self, bucket: Bucket) -> None:
        """Every gradient of ``bucket`` is ready and summed over its partial groups (nothing here)."""

    def backward_complete(self, incomplete: list[Bucket]) -> None:
        """Every gradient is ready; ``incomplete``: the buckets bucket_complete did not see (nothing here)."""


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
