"""Data parallelism: every rank holds the whole model and trains on its own slice of each global batch.

The seed (slides-ai-systems-distributed-dl-part2.txt, "Synchronous Data Parallelism"): compute the entire
model on each processor, distribute the batch across the processors, allreduce the gradients, and every
replica applies the same update

    slide:  w¹ = w⁰ − α/B · Σ_{i=1..B} ∂J_i(w⁰)/∂w
    code:   rank r holds n_r of the B examples; it backpropagates the weighted loss (n_r/B)·mean_r(ℓ)
            = Σ_{i∈r} ℓ_i / B, so its gradient is g_r = Σ_{i∈r} ∂ℓ_i/∂w / B, and the allreduce *sum*
            Σ_r g_r is exactly the full-batch gradient, even when B does not divide by P (shards differ
            by one example). P ≤ B: a rank with no example has nothing to compute.

    dp = DataParallel(comm, model, optimizer, CrossEntropyLoss(), algorithm="ring")
    for x, y in global_batches:          # the same global batch on every rank
        loss = dp.train_step(x, y)       # this rank's shard: forward, backward + bucket allreduces, step

Replicas must start identical: build the model from the same seed on every rank, or pass
``broadcast_parameters=True`` (rank 0's values are broadcast). The constructor checks it (a hash of every
parameter, allgathered) and raises ValueError if the replicas differ in shape or value. ``check_replicas()``
repeats the bitwise check at any time (``check_every_step=True`` after every step: a debugging aid).

Gradient accumulation: ``with dp.no_sync(): dp.forward_backward(x1, y1)`` adds gradients without
communicating; the next ``forward_backward`` outside ``no_sync`` allreduces the sum once, and ``step()``
divides by the number k of micro-steps, so k equal micro-batches of B give the step on the kB batch.

Mixed precision: pass ``mixed=MixedPrecisionTrainer(model, optimizer, loss_fn, FP16, ...)``. Per step:
the trainer's scaled low-precision forward/backward on the shard; the bucket allreduces of the *scaled*
gradients (as DDP under a GradScaler: communication overlaps backward); the sum rounded to grad_fmt (what
an allreduce in that format delivers, so an overflow of the full-batch gradient is seen as in one
process); the trainer's unscale (→ found_inf); found_inf reduced with max across ranks; then every rank
skips — or applies — the same step. (Once summed, an Inf on one rank already makes every rank's sum
Inf/NaN; the max of the flags states the rule explicitly and costs one 8-byte allreduce. Per-rank partial
sums in FP16 can still differ from the full-batch sum near the overflow threshold, as on real hardware.)

How the overlap is modelled. The processes and the arithmetic are real; the *clock* is simulated
(minidist.cluster: a message of n bytes costs α + nβ, ``comm.compute(flops)`` costs flops / FLOP/s).
Forward: each layer is charged ``layer.flops(input_shape)`` with ``comm.compute``; its backward costs
twice its forward. A real GPU runs backward kernels and NCCL allreduces on two streams at once; here one
rank is one process, so we keep two clocks:

* the compute stream, a number ``t`` advanced by each layer's backward cost (recorded in
  ``compute_spans``), and
* the communication stream, which is ``comm.clock`` itself (the ledger records its sends and receives).

Backward runs layer by layer, from the last layer to the first. When a layer's backward completes a
bucket (all its gradients are ready, at time t) the bucket's allreduce is issued right there, between two
layers' backward calls: if the communication stream is idle it first advances to t (``comm.elapse``,
labelled "backward until bucket k is ready"), then the allreduce advances it by α-β time, while the
compute stream keeps going. Buckets go out in order, one at a time. The step ends at
max(t at the end of backward, end of the last allreduce); the optimizer update is not charged. With
``overlap=False`` every bucket waits for the end of backward. With mixed precision the whole backward
runs first (in the trainer) and the buckets are issued afterwards at the same simulated times.
``minidist.parallel.overlap`` draws the two streams and computes the same schedule in closed form.

Not synchronised: BatchNorm's batch statistics (each rank normalises with its own shard's statistics, as
DDP without SyncBatchNorm) and its running buffers.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from minidist.cluster import Span
from minidist.collectives import ALGORITHMS, allgather, allreduce, broadcast
from minidist.nn.module import Module
from minidist.parallel.buckets import (
    DEFAULT_BUCKET_BYTES,
    allreduce_bucket,
    allreduce_in_place,
    assign_buckets,
    parameter_digest,
    parameter_signature,
    ready_layers,
)
from minidist.parallel.shards import ShardWeightedLoss, leaf_layers, shard_bounds
from minidist.precision.formats import quantize
from minidist.precision.mixed import MixedPrecisionTrainer

__all__ = ["DataParallel", "ShardWeightedLoss", "leaf_layers", "shard_bounds"]


class DataParallel:
    """Data-parallel training of ``model`` with ``optimizer`` and ``loss_fn`` on the ranks of ``comm``.

    Args:
        comm: the Communicator (every rank builds its own DataParallel over its own replica).
        model, optimizer, loss_fn: a minidist Module, an optimizer over model.parameters(), a loss.
        algorithm: the allreduce algorithm ("ring", "tree", ..., or "auto").
        bucket_bytes: bucket capacity in bytes (DDP's default 25 MiB); None = one allreduce per parameter.
        overlap: issue each bucket as soon as it is ready (True) or after the whole backward (False).
        mixed: a MixedPrecisionTrainer over the same model and optimizer (None: plain precision).
        broadcast_parameters: copy rank 0's parameters to every rank first.
        check_every_step: check after every step that the replicas are bitwise identical.
        gradient_as_bucket_view: make every Parameter.grad a view into its bucket's flat buffer (as
            PyTorch's DDP option of that name), so no flatten and copy-back is needed (layers must *add*
            into .grad in place, as every minidist layer does; a replaced .grad is detected).
    """

    def __init__(self, comm, model: Module, optimizer, loss_fn, *, algorithm: str = "ring",
                 bucket_bytes: int | None = DEFAULT_BUCKET_BYTES, overlap: bool = True,
                 mixed: MixedPrecisionTrainer | None = None, broadcast_parameters: bool = False,
                 check_every_step: bool = False, gradient_as_bucket_view: bool = False):
        if not (hasattr(comm, "rank") and hasattr(comm, "world_size")):
            raise TypeError(f"comm must be a Communicator, got {type(comm).__name__}")
        if not isinstance(model, Module):
            raise TypeError(f"model must be a minidist Module, got {type(model).__name__}")
        for name in ("step", "zero_grad"):
            if not callable(getattr(optimizer, name, None)):
                raise TypeError(f"optimizer must have .{name}(), got {type(optimizer).__name__}")
        if not (callable(getattr(loss_fn, "forward", None)) and callable(getattr(loss_fn, "backward", None))):
            raise TypeError(f"loss_fn must have forward(logits, target) and backward(), got {type(loss_fn).__name__}")
        if algorithm != "auto" and algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)} or 'auto', got {algorithm!r}")
        if mixed is not None and not (isinstance(mixed, MixedPrecisionTrainer) and mixed.model is model
                                      and mixed.optimizer is optimizer):
            raise ValueError("mixed must be a MixedPrecisionTrainer built on the same model and optimizer")
        self.comm, self.model, self.optimizer, self.loss_fn = comm, model, optimizer, loss_fn
        self.algorithm, self.overlap, self.mixed = algorithm, bool(overlap), mixed
        self.check_every_step = check_every_step
        self.params = model.parameters()
        if not self.params:
            raise ValueError("model has no parameters: nothing to train data-parallel")
        if len({p.data.dtype for p in self.params}) > 1:
            raise TypeError(f"all parameters must share one dtype, got {sorted({str(p.data.dtype) for p in self.params})}")
        self.layers = leaf_layers(model)
        self.buckets = assign_buckets(self.params, bucket_bytes)
        self.ready_at: list[list] = [[] for _ in self.layers]   # buckets completed by layer i's backward
        for bucket, layer in zip(self.buckets, ready_layers(self.layers, self.buckets)):
            self.ready_at[layer].append(bucket)
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view) and comm.world_size > 1
        if self.gradient_as_bucket_view:
            for bucket in self.buckets:
                bucket.buffer = np.empty(bucket.size, dtype=self.params[0].grad.dtype)
                offset = 0
                for p in bucket.params:
                    view = bucket.buffer[offset:offset + p.size].reshape(p.shape)
                    view[...] = p.grad
                    p.grad, offset = view, offset + p.size
        self.compute_spans: list[Span] = []   # the compute stream on the simulated clock
        self._syncing, self._synced, self._micro_steps, self._found_inf = True, False, 0, False
        self._probed: dict[tuple, list[tuple]] = {}
        self._check_start(broadcast_parameters)

    # -- replicas -------------------------------------------------------------------------------------------
    def _check_start(self, broadcast_parameters: bool) -> None:
        signatures = allgather(self.comm, parameter_signature(self.params))
        differ = [r for r, s in enumerate(signatures) if not np.array_equal(s, signatures[0])]
        if differ:
            described = ", ".join(f"rank {r}: {s[0]} parameters, {s[1]} elements"
                                  for r, s in enumerate(signatures) if r in [0, *differ])
            raise ValueError(f"data-parallel replicas must have the same parameter shapes and dtypes; "
                             f"rank(s) {differ} differ from rank 0 ({described})")
        if broadcast_parameters:
            for p in self.params:
                p.data[...] = broadcast(self.comm, p.data, root=0)
        self.check_replicas("replicas start different: build the model from the same seed on every rank "
                            "or pass broadcast_parameters=True")

    def check_replicas(self, what: str = "replicas are not bitwise identical") -> None:
        """Raise ValueError unless every rank's parameters are bitwise equal to rank 0's (collective)."""
        digests = allgather(self.comm, parameter_digest(self.params))
        differ = [r for r, d in enumerate(digests) if not np.array_equal(d, digests[0])]
        if differ:
            raise ValueError(f"{what}: the parameters of rank(s) {differ} differ from rank 0's")

    # -- one global batch -------------------------------------------------------------------------------------
    def shard(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """This rank's contiguous slice of the global batch and its weight n_r / B."""
        if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)) or x.ndim < 1 or len(x) != len(y):
            raise ValueError(f"expected arrays x and y with the same first (batch) dimension, got "
                             f"{getattr(x, 'shape', type(x).__name__)} and {getattr(y, 'shape', type(y).__name__)}")
        batch, p = len(x), self.comm.world_size
        if batch < p:
            raise ValueError(f"a global batch of {batch} examples cannot be split over {p} ranks: data "
                             f"parallelism needs P <= B (at least one example per rank)")
        lo, hi = shard_bounds(batch, p, self.comm.rank)
        return x[lo:hi], y[lo:hi], (hi - lo) / batch

    def forward_backward(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward on this rank's shard of the global batch (x, y); gradients are *added*.

        Outside ``no_sync`` the gradients are then allreduced bucket by bucket. Returns this rank's
        mean loss over its shard.
        """
        if self._synced:
            raise RuntimeError("the gradients were already averaged: call step() (or zero_grad()) before "
                               "the next forward_backward")
        x_r, y_r, weight = self.shard(x, y)
        loss_fn = ShardWeightedLoss(self.loss_fn, weight)
        self._micro_steps += 1
        if self.mixed is None:
            loss = self._plain_forward_backward(x_r, y_r, loss_fn)
        else:
            loss = self._mixed_forward_backward(x_r, y_r, loss_fn)
        self._synced = self._syncing
        return loss

    def step(self) -> bool:
        """Apply the averaged gradients (divided by the number of micro-steps); False if skipped (overflow)."""
        if not self._synced:
            raise RuntimeError("step() needs averaged gradients: the last forward_backward must run outside "
                               "no_sync()")
        if self._micro_steps > 1:
            for p in self.params:
                p.grad /= self._micro_steps
        if self.mixed is None:
            self.optimizer.step()
            applied = True
        else:
            applied = self.mixed.step(self._found_inf)
        self._synced, self._micro_steps = False, 0
        if self.check_every_step:
            self.check_replicas()
        return applied

    def zero_grad(self) -> None:
        self.model.zero_grad()
        self._synced, self._micro_steps = False, 0

    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """zero_grad, forward_backward on the shard (with the allreduces), step. Returns the shard's loss."""
        self.zero_grad()
        loss = self.forward_backward(x, y)
        self.step()
        return loss

    @contextmanager
    def no_sync(self):
        """Inside: forward_backward only accumulates gradients locally (no communication)."""
        self._syncing = False
        try:
            yield self
        finally:
            self._syncing = True

    # -- the two paths ------------------------------------------------------------------------------------------
    def _plain_forward_backward(self, x: np.ndarray, y: np.ndarray, loss_fn: ShardWeightedLoss) -> float:
        h, shapes = x, []
        for layer in self.layers:
            shapes.append(h.shape)
            h = layer.forward(h)
        forward_times = self._charge_forward(shapes)
        loss = loss_fn.forward(h, y)
        grad = [loss_fn.backward()]

        def backward_layer(i: int) -> None:
            grad[0] = self.layers[i].backward(grad[0])

        self._backward(forward_times, backward_layer)
        return loss

    def _mixed_forward_backward(self, x: np.ndarray, y: np.ndarray, loss_fn: ShardWeightedLoss) -> float:
        shapes = self._input_shapes(x.shape)
        original = self.mixed.loss_fn
        self.mixed.loss_fn = loss_fn
        try:
            loss = self.mixed.forward_backward(x, y)
        finally:
            self.mixed.loss_fn = original
        forward_times = self._charge_forward(shapes)
        with np.errstate(over="ignore", invalid="ignore"):   # Inf/NaN is expected: the step is skipped
            self._backward(forward_times, None)               # the buckets' allreduces (scaled gradients)
            if self._syncing:
                for p in self.params:                         # the sum arrives in grad_fmt, as from an
                    p.grad[...] = quantize(p.grad, self.mixed.grad_fmt)   # allreduce in that format
                found_inf = self.mixed.unscale()              # elementwise: the clock treats it as free
                flag = allreduce(self.comm, np.array([float(found_inf)]), op="max", algorithm=self.algorithm)
                self._found_inf = bool(flag[0])
        return loss

    # -- the simulated clock --------------------------------------------------------------------------------------
    def _charge_forward(self, shapes: list[tuple]) -> list[float]:
        """Charge every layer's forward FLOPs to the clock; return each layer's forward time."""
        times = []
        for layer, shape in zip(self.layers, shapes):
            start = self.comm.clock
            flops = layer.flops(shape) if callable(getattr(layer, "flops", None)) else 0
            self.comm.compute(flops, label=f"forward {type(layer).__name__}")
            self.compute_spans.append(Span(self.comm.rank, start, self.comm.clock, "compute",
                                           f"forward {type(layer).__name__}"))
            times.append(self.comm.clock - start)
        return times

    def _backward(self, forward_times: list[float], backward_layer) -> None:
        """Backward from the last layer to the first (2x each forward time); buckets go out when ready."""
        t = self.comm.clock                          # the compute stream starts where the forward ended
        communicate = self._syncing
        for i in reversed(range(len(self.layers))):
            if backward_layer is not None:
                backward_layer(i)
            start, t = t, t + 2 * forward_times[i]
            self.compute_spans.append(Span(self.comm.rank, start, t, "compute",
                                           f"backward {type(self.layers[i]).__name__}"))
            if communicate and self.overlap:
                for bucket in self.ready_at[i]:
                    self._issue(bucket, t)
        if communicate and not self.overlap:
            for bucket in self.buckets:
                self._issue(bucket, t)
        if self.comm.clock < t:                      # the compute stream finished last
            self.comm.elapse(t - self.comm.clock, label="backward")

    def _issue(self, bucket, ready: float) -> None:
        if self.comm.clock < ready:                  # the communication stream waits for the gradients
            self.comm.elapse(ready - self.comm.clock, label=f"backward until bucket {bucket.index} is ready")
        if self.comm.world_size == 1:                # a sum over one rank changes nothing: skip the copies
            return
        if self.gradient_as_bucket_view:             # the gradients already lie in the buffer, in order
            if not all(p.grad.base is bucket.buffer for p in bucket.params):
                raise ValueError("gradient_as_bucket_view: a Parameter.grad was replaced by a new array; "
                                 "layers and optimizers must update .grad in place")
            total = allreduce_in_place(self.comm, bucket.buffer, self.algorithm)
            if total is not bucket.buffer:
                bucket.buffer[...] = total
            return
        if bucket.buffer is None:
            bucket.buffer = np.empty(bucket.size, dtype=self.params[0].grad.dtype)
        allreduce_bucket(self.comm, [p.grad for p in bucket.params], self.algorithm, bucket.buffer)

    def _input_shapes(self, x_shape: tuple) -> list[tuple]:
        """Each layer's input shape for a batch of x_shape, found once by a one-example forward in eval mode."""
        key = tuple(x_shape[1:])
        if key not in self._probed:
            modes = [(m, m.training) for m in self.model.modules()]
            self.model.eval()
            h, shapes = np.zeros((1, *key), dtype=self.params[0].data.dtype), []
            try:
                for layer in self.layers:
                    shapes.append(h.shape[1:])
                    h = layer.forward(h)
            finally:
                for m, mode in modes:
                    m.training = mode
            self._probed[key] = shapes
        return [(x_shape[0], *shape) for shape in self._probed[key]]
