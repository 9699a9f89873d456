"""Data parallelism: every rank holds the whole model and trains on its own slice of each global batch.

The update of naive.py ("Distributed Deep Learning (Part II)" slides, "Synchronous Data Parallelism"):
rank r holds n_r of the B examples and backpropagates (n_r/B)·mean_r(ℓ), so the allreduce *sum* Σ_r g_r
is the full-batch gradient, also when P does not divide B (shards differ by one example; P ≤ B). Here the
runner's gradient sync (sync.GradientSync) sends the gradients in buckets (buckets.py), each allreduced as
soon as backward has produced it; on the simulated clock that allreduce overlaps the rest of backward
(overlap.py: the two streams), as PyTorch's DistributedDataParallel.

    dp = DataParallel(comm, model, optimizer, CrossEntropyLoss(), algorithm="ring")
    for x, y in global_batches:          # the same global batch on every rank
        loss = dp.train_step(x, y)       # this rank's shard: forward, backward + bucket allreduces, step

Replicas must start identical: the same seed on every rank, or ``broadcast_parameters=True``; checked by
allgathers of hashes (of the shapes and dtypes, then of the bytes: a ValueError on every rank alike). ``with
dp.no_sync():`` accumulates micro-steps without communicating; step() divides by their number.
``mixed=MixedPrecisionTrainer(...)``: found_inf agreed as GradientSync says. Not synchronised: BatchNorm's
batch statistics and buffers (DDP without SyncBatchNorm).
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager

import numpy as np

from minidist.collectives import ALGORITHMS, allgather, broadcast
from minidist.collectives.hierarchical import TOPOLOGY_ALGORITHMS, node_layout
from minidist.nn.module import Module, Parameter
from minidist.nn.runner import StepRunner
from minidist.precision.mixed import FullPrecision, MixedPrecisionTrainer
from minidist.sim.compute import ComputeCharges
from minidist.sim.memory import MemoryRecorder, held_bytes

from ..shards import ShardWeightedLoss, check_trainer, shard_range
from .buckets import DEFAULT_BUCKET_BYTES, ready_layers
from .sync import GradientSync

__all__ = ["DataParallel", "check_same_layout", "check_same_values"]


class DataParallel:
    """Data-parallel training of ``model`` with ``optimizer`` and ``loss_fn`` on the ranks of ``comm``.

    Args:
        comm: the Communicator (every rank builds its own DataParallel over its own replica).
        model, optimizer, loss_fn: a minidist Module, an optimizer over model.parameters(), a loss.
        algorithm, bucket_bytes, overlap, gradient_as_bucket_view: the gradient sync's (sync.GradientSync).
        mixed: a MixedPrecisionTrainer over the same model and optimizer (None: plain precision).
        broadcast_parameters: copy rank 0's parameters to every rank first.
        check_every_step: check after every step that the replicas are bitwise identical.
        memory: a minidist.sim.memory.MemoryLedger: held bytes recorded after forward, after each layer that
            completes a bucket, after backward and after step (None: nothing recorded, no cost).
    """

    def __init__(self, comm, model: Module, optimizer, loss_fn, *, algorithm: str = "ring",
                 bucket_bytes: int | None = DEFAULT_BUCKET_BYTES, overlap: bool = True,
                 mixed: MixedPrecisionTrainer | None = None, broadcast_parameters: bool = False,
                 check_every_step: bool = False, gradient_as_bucket_view: bool = False, memory=None):
        self.params = check_trainer(comm, model, loss_fn)
        for name in ("step", "zero_grad"):
            if not callable(getattr(optimizer, name, None)):
                raise TypeError(f"optimizer must have .{name}(), got {type(optimizer).__name__}")
        if algorithm not in ("auto", "shared_memory") and algorithm not in ALGORITHMS \
                and algorithm not in TOPOLOGY_ALGORITHMS:
            raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, {sorted(TOPOLOGY_ALGORITHMS)} "
                             f"(on a Topology), 'shared_memory' or 'auto', got {algorithm!r}")
        if algorithm in TOPOLOGY_ALGORITHMS:
            node_layout(comm, algorithm)    # a run with a Topology and nodes of equal size, or ValueError
        if mixed is not None and not (isinstance(mixed, MixedPrecisionTrainer) and mixed.model is model
                                      and mixed.optimizer is optimizer):
            raise ValueError("mixed must be a MixedPrecisionTrainer built on the same model and optimizer")
        self.comm, self.model, self.optimizer, self.loss_fn = comm, model, optimizer, loss_fn
        self.check_every_step = check_every_step
        self.precision = mixed if mixed is not None else FullPrecision(optimizer)
        self.clock = ComputeCharges(comm)               # the compute stream on the simulated clock
        self.sync = GradientSync(model, comm, algorithm=algorithm, bucket_bytes=bucket_bytes, overlap=overlap,
                                 mixed=self.precision, clock=self.clock,
                                 gradient_as_bucket_view=gradient_as_bucket_view)
        self.buckets = self.sync.buckets
        completes = ready_layers(self.sync.units, self.buckets)    # the layers whose backward ends a bucket
        self.recorder = MemoryRecorder(memory, self.held, comm, backward_points={   # records after the sync
            i: f"backward layer {i}" for i in sorted(set(completes))})
        self.runner = StepRunner(model, loss_fn, [self.recorder, self.sync, self.clock, self.precision])
        self._syncing, self._synced, self._micro_steps = True, False, 0
        check_same_layout(comm, self.params)
        if broadcast_parameters:
            for p in self.params:
                p.data[...] = broadcast(comm, p.data, root=0)
        self.check_replicas("replicas start different: build the model from the same seed on every rank "
                            "or pass broadcast_parameters=True")

    # -- replicas -------------------------------------------------------------------------------------------
    def check_replicas(self, what: str = "replicas are not bitwise identical") -> None:
        """Raise ValueError unless every rank's parameters are bitwise equal to rank 0's (collective)."""
        check_same_values(self.comm, self.params, what)

    # -- one global batch ------------------------------------------------------------------------------------
    def forward_backward(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward on this rank's shard of the global batch; gradients are *added* (outside
        ``no_sync`` then allreduced bucket by bucket). x: the global batch (B, ...), the same on every rank;
        y: its targets (B, ...). Returns this rank's mean loss over its shard (a float)."""
        if self._synced:
            raise RuntimeError("the gradients were already averaged: call step() (or zero_grad()) before "
                               "the next forward_backward")
        lo, hi = shard_range(self.comm, x, y)                # this rank's slice, its loss weighted n_r / B
        self.runner.loss_fn = ShardWeightedLoss(self.loss_fn, (hi - lo) / len(x))
        self._micro_steps += 1
        loss = self.runner.forward_backward(x[lo:hi], y[lo:hi], last=self._syncing)
        self._synced = self._syncing
        return loss

    def step(self) -> bool:
        """Apply the summed gradients divided by the number of micro-steps; False if skipped (overflow)."""
        if not self._synced:
            raise RuntimeError("step() needs averaged gradients: the last forward_backward must run outside "
                               "no_sync()")
        if self._micro_steps > 1:
            for p in self.params:
                p.grad /= self._micro_steps
        applied = self.precision.step(self.sync.found_inf)
        self._synced, self._micro_steps = False, 0
        self.recorder.record("after step")
        if self.check_every_step:
            self.check_replicas()
        return applied

    def zero_grad(self) -> None:
        self.model.zero_grad()
        self._synced, self._micro_steps = False, 0

    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """zero_grad, forward_backward on the global batch (x, y) with the allreduces, step; returns the
        shard's mean loss."""
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

    def held(self) -> dict[str, int]:
        """Bytes this rank holds now, by category (sim.memory.held_bytes); bucket buffers as buffers."""
        return held_bytes(self.model, self.optimizer, buffers=[b.buffer for b in self.buckets])


def check_same_layout(comm, params: list[Parameter]) -> None:
    """Raise ValueError (on every rank) unless every rank's parameters have rank 0's shapes and dtypes."""
    layout = ";".join(f"{p.shape}:{p.data.dtype}" for p in params).encode()
    digest = np.frombuffer(hashlib.sha256(layout).digest()[:8], dtype=np.int64)[0]
    signature = np.array([len(params), sum(p.size for p in params), digest], dtype=np.int64)   # fixed size
    signatures = allgather(comm, signature)
    differ = [r for r, s in enumerate(signatures) if not np.array_equal(s, signatures[0])]
    if differ:
        described = ", ".join(f"rank {r}: {s[0]} parameters, {s[1]} elements"
                              for r, s in enumerate(signatures) if r in [0, *differ])
        raise ValueError(f"data-parallel replicas must have the same parameter shapes and dtypes; "
                         f"rank(s) {differ} differ from rank 0 ({described})")


def check_same_values(comm, params: list[Parameter],
                      what: str = "replicas are not bitwise identical") -> None:
    """Raise ValueError (on every rank) unless every rank's parameters are bitwise equal to rank 0's."""
    h = hashlib.sha256()                                     # of every parameter's bytes: 32 uint8
    for p in params:
        h.update(np.ascontiguousarray(p.data).tobytes())
    digests = allgather(comm, np.frombuffer(h.digest(), dtype=np.uint8).copy())
    differ = [r for r, d in enumerate(digests) if not np.array_equal(d, digests[0])]
    if differ:
        raise ValueError(f"{what}: the parameters of rank(s) {differ} differ from rank 0's")
