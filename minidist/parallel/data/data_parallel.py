"""Data parallelism: every rank holds the whole model and trains on its own slice of each global batch.

"Distributed Deep Learning (Part II)" slides, "Synchronous Data Parallelism": compute the
entire model on each processor, distribute the batch, allreduce the gradients, apply the same update:

    slide:  w¹ = w⁰ − α/B · Σ_{i=1..B} ∂J_i(w⁰)/∂w
    code:   rank r holds n_r of the B examples and backpropagates (n_r/B)·mean_r(ℓ) = Σ_{i∈r} ℓ_i / B,
            so the allreduce *sum* Σ_r g_r is exactly the full-batch gradient, also when P does not
            divide B (shards differ by one example; P ≤ B).

    dp = DataParallel(comm, model, optimizer, CrossEntropyLoss(), algorithm="ring")
    for x, y in global_batches:          # the same global batch on every rank
        loss = dp.train_step(x, y)       # this rank's shard: forward, backward + bucket allreduces, step

Replicas must start identical: the same seed on every rank, or ``broadcast_parameters=True`` (replicas.py
checks). Gradients travel in buckets (comm.py), each allreduced as soon as backward has produced it; on
the simulated clock that allreduce overlaps the rest of backward (overlap.py: the two streams).
``with dp.no_sync():`` accumulates micro-steps without communicating; step() divides by their number.
``mixed=MixedPrecisionTrainer(...)``: the scaled gradients are allreduced, the sum rounded to grad_fmt
(as an allreduce in that format delivers it), found_inf reduced with max so every rank skips or applies
the same step. Not synchronised: BatchNorm's batch statistics and buffers (DDP without SyncBatchNorm).
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from minidist.cluster import Span
from minidist.memory import record
from minidist.collectives import ALGORITHMS, allreduce, broadcast
from minidist.collectives.hierarchical import TOPOLOGY_ALGORITHMS, node_layout
from minidist.nn.module import Module
from .comm import DEFAULT_BUCKET_BYTES, allreduce_bucket, assign_buckets, ready_layers
from .replicas import check_same_layout, check_same_values
from .shards import ShardWeightedLoss, charge_forward, input_shapes, leaf_layers
from minidist.precision import quantize
from minidist.precision.mixed import MixedPrecisionTrainer
from minidist.split import split_range

__all__ = ["DataParallel", "ShardWeightedLoss", "leaf_layers"]


class DataParallel:
    """Data-parallel training of ``model`` with ``optimizer`` and ``loss_fn`` on the ranks of ``comm``.

    Args:
        comm: the Communicator (every rank builds its own DataParallel over its own replica).
        model, optimizer, loss_fn: a minidist Module, an optimizer over model.parameters(), a loss.
        algorithm: the allreduce algorithm ("ring", "tree", ..., "hierarchical" or "torus" under
            ``run(..., link=Topology(...))``, or "auto", which chooses by topology and size).
        bucket_bytes: bucket capacity in bytes (DDP's default 25 MiB); None = one allreduce per parameter.
        overlap: issue each bucket as soon as it is ready (True) or after the whole backward (False).
        mixed: a MixedPrecisionTrainer over the same model and optimizer (None: plain precision).
        broadcast_parameters: copy rank 0's parameters to every rank first.
        check_every_step: check after every step that the replicas are bitwise identical.
        gradient_as_bucket_view: make every Parameter.grad a view into its bucket's flat buffer (as
            PyTorch's DDP option of that name), so no flatten and copy-back is needed (layers must *add*
            into .grad in place, as every minidist layer does; a replaced .grad is detected).
        memory: a minidist.memory.MemoryLedger: held bytes recorded after forward, after each layer that
            completes a bucket, after backward and after step (None: nothing recorded, no cost).
    """

    def __init__(self, comm, model: Module, optimizer, loss_fn, *, algorithm: str = "ring",
                 bucket_bytes: int | None = DEFAULT_BUCKET_BYTES, overlap: bool = True,
                 mixed: MixedPrecisionTrainer | None = None, broadcast_parameters: bool = False,
                 check_every_step: bool = False, gradient_as_bucket_view: bool = False, memory=None):
        if not (hasattr(comm, "rank") and hasattr(comm, "world_size")):
            raise TypeError(f"comm must be a Communicator, got {type(comm).__name__}")
        if not isinstance(model, Module):
            raise TypeError(f"model must be a minidist Module, got {type(model).__name__}")
        for name in ("step", "zero_grad"):
            if not callable(getattr(optimizer, name, None)):
                raise TypeError(f"optimizer must have .{name}(), got {type(optimizer).__name__}")
        if not (callable(getattr(loss_fn, "forward", None)) and callable(getattr(loss_fn, "backward", None))):
            raise TypeError(f"loss_fn must have forward(logits, target) and backward(), got {type(loss_fn).__name__}")
        if algorithm != "auto" and algorithm not in ALGORITHMS and algorithm not in TOPOLOGY_ALGORITHMS:
            raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, {sorted(TOPOLOGY_ALGORITHMS)} "
                             f"(on a Topology) or 'auto', got {algorithm!r}")
        if algorithm in TOPOLOGY_ALGORITHMS:
            node_layout(comm, algorithm)    # a run with a Topology and nodes of equal size, or ValueError
        if mixed is not None and not (isinstance(mixed, MixedPrecisionTrainer) and mixed.model is model
                                      and mixed.optimizer is optimizer):
            raise ValueError("mixed must be a MixedPrecisionTrainer built on the same model and optimizer")
        self.comm, self.model, self.optimizer, self.loss_fn = comm, model, optimizer, loss_fn
        self.algorithm, self.overlap, self.mixed = algorithm, bool(overlap), mixed
        self.check_every_step, self.memory = check_every_step, memory
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
        check_same_layout(self.comm, self.params)
        if broadcast_parameters:
            for p in self.params:
                p.data[...] = broadcast(self.comm, p.data, root=0)
        self.check_replicas("replicas start different: build the model from the same seed on every rank "
                            "or pass broadcast_parameters=True")

    def check_replicas(self, what: str = "replicas are not bitwise identical") -> None:
        """Raise ValueError unless every rank's parameters are bitwise equal to rank 0's (collective)."""
        check_same_values(self.comm, self.params, what)

    # -- one global batch -------------------------------------------------------------------------------------
    def shard(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """x: the global batch, shape (B, ...); y: its targets, (B, ...). Returns this rank's contiguous
        slice x_r (n_r, ...), y_r (n_r, ...) and its weight n_r / B."""
        if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)) or x.ndim < 1 or len(x) != len(y):
            raise ValueError(f"expected arrays x and y with the same first (batch) dimension, got "
                             f"{getattr(x, 'shape', type(x).__name__)} and {getattr(y, 'shape', type(y).__name__)}")
        batch, p = len(x), self.comm.world_size
        if batch < p:
            raise ValueError(f"a global batch of {batch} examples cannot be split over {p} ranks: data "
                             f"parallelism needs P <= B (at least one example per rank)")
        lo, hi = split_range(batch, p, self.comm.rank)
        return x[lo:hi], y[lo:hi], (hi - lo) / batch

    def forward_backward(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward on this rank's shard of the global batch; gradients are *added*.

        x: the global batch, shape (B, ...), the same on every rank; y: its targets, (B, ...).
        Outside ``no_sync`` the gradients are then allreduced bucket by bucket. Returns this rank's
        mean loss over its shard (a float).
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
        self._record("after backward")
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
        self._record("after step")
        if self.check_every_step:
            self.check_replicas()
        return applied

    def zero_grad(self) -> None:
        self.model.zero_grad()
        self._synced, self._micro_steps = False, 0

    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """zero_grad, forward_backward on the shard (with the allreduces), step.

        x: the global batch, shape (B, ...); y: its targets, (B, ...). Returns the shard's mean loss.
        """
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
        forward_times = charge_forward(self.comm, self.layers, shapes, self.compute_spans)
        loss = loss_fn.forward(h, y)
        self._record("after forward")
        grad = [loss_fn.backward()]

        def backward_layer(i: int) -> None:
            grad[0] = self.layers[i].backward(grad[0])

        self._backward(forward_times, backward_layer)
        return loss

    def _mixed_forward_backward(self, x: np.ndarray, y: np.ndarray, loss_fn: ShardWeightedLoss) -> float:
        shapes = input_shapes(self.model, self.layers, x.shape, self._probed)
        original = self.mixed.loss_fn
        self.mixed.loss_fn = loss_fn
        try:
            loss = self.mixed.forward_backward(x, y)
        finally:
            self.mixed.loss_fn = original
        forward_times = charge_forward(self.comm, self.layers, shapes, self.compute_spans)
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
    def _backward(self, forward_times: list[float], backward_layer) -> None:
        """Backward from the last layer to the first; buckets go out when ready, on two clocks.

        A GPU runs backward kernels and allreduces on two streams at once; one rank here is one process,
        so the compute stream is a number t (each layer's backward costs 2x its forward, recorded in
        compute_spans) and the communication stream is comm.clock itself. When layer i's backward
        completes a bucket at time t, the bucket is issued right there: the communication stream first
        waits until t, then pays the allreduce's α-β time. The step ends at max(t, end of the last
        allreduce). overlap=False issues every bucket after the whole backward.
        """
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
            if self.ready_at[i]:
                self._record(f"backward layer {i}")
        if communicate and not self.overlap:
            for bucket in self.buckets:
                self._issue(bucket, t)
        if self.comm.clock < t:                      # the compute stream finished last
            self.comm.elapse(t - self.comm.clock, label="backward")

    def _record(self, label: str) -> None:
        """Append this rank's held bytes to the ledger (if any); bucket buffers count as buffers."""
        record(self.memory, label, self.model, self.optimizer, buffers=[b.buffer for b in self.buckets],
               time=self.comm.clock)

    def _issue(self, bucket, ready: float) -> None:
        if self.comm.clock < ready:                  # the communication stream waits for the gradients
            self.comm.elapse(ready - self.comm.clock, label=f"backward until bucket {bucket.index} is ready")
        if self.comm.world_size == 1:                # a sum over one rank changes nothing: skip the copies
            return
        if self.gradient_as_bucket_view:             # the gradients already lie in the buffer, in order
            if not all(p.grad.base is bucket.buffer for p in bucket.params):
                raise ValueError("gradient_as_bucket_view: a Parameter.grad was replaced by a new array; "
                                 "layers and optimizers must update .grad in place")
            allreduce(self.comm, bucket.buffer, op="sum", algorithm=self.algorithm, out=bucket.buffer)
            return
        if bucket.buffer is None:
            bucket.buffer = np.empty(bucket.size, dtype=self.params[0].grad.dtype)
        allreduce_bucket(self.comm, [p.grad for p in bucket.params], self.algorithm, bucket.buffer)
