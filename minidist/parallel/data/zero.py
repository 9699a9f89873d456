"""ZeRO stages 1-3 (stage 3 = FSDP): data parallelism whose optimizer state, gradients and parameters are
sharded over the ranks.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"; PyTorch's
FullyShardedDataParallel with one unit per layer for stage 3. Every rank computes the full gradient of its
slice of the batch, but the optimizer updates only its piece of each flat group (flat.py: a bucket for
stages 1-2, a layer for stage 3), so K bytes of optimizer state per parameter become K/P (b bytes per
parameter or gradient):

    DataParallel   (b + b + K) Ψ            allreduce = reduce-scatter + allgather: 2(P − 1)/P · bΨ sent
    ZeRO-1         (b + b) Ψ + K Ψ_r        reduce-scatter the gradients, update the shard, allgather it
    ZeRO-2         b Ψ + (b + K) Ψ_r        the same, but each bucket's full gradient is freed as soon as
                                            backward has produced it and it is reduce-scattered
    ZeRO-3         (b + b + K) Ψ_r          + while layer l runs: b Ψ_l gathered (forward), 2 b Ψ_l
                                            (backward: its parameters and full gradient)

with Ψ_r = Σ over groups of the rank's piece (Ψ/P when P divides every group). Bytes sent per rank and
step: stages 1-2 data parallelism's; stage 3 two allgathers (forward and backward gather each layer) and
one reduce-scatter of every layer, 3(P − 1)/P · bΨ (1.5x). Between stage-3 steps the model's Parameters
hold no data (None); ``full_parameters()`` gathers them.

The class composes, on one step runner, the ZeRO attachment (zero_sync.ZeroSync: when each stage
reduce-scatters, steps and gathers), the memory recorder, the compute clock (no overlap), the precision.

    zero = ZeRO(comm, model, lambda shards: Adam(shards, lr=1e-3), CrossEntropyLoss(), stage=2)
    loss = zero.train_step(x, y)      # x, y: the global batch, the same on every rank
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import allgather
from minidist.nn.runner import StepRunner, units
from minidist.sim.compute import ComputeCharges
from minidist.sim.memory import MemoryRecorder, held_bytes

from ..shards import ShardWeightedLoss, check_trainer, shard_range
from . import flat
from .buckets import DEFAULT_BUCKET_BYTES, ready_layers
from .data_parallel import check_same_layout, check_same_values
from .zero_mixed import ShardedMixedPrecision
from .zero_sync import ZeroSync


class ZeRO:
    """ZeRO stage 1, 2 or 3 over the ranks of ``comm`` (see the module docstring); ring reduce-scatter and
    allgather only (the shards follow its chunking); everything is checked before anything changes.

    Args:
        comm: the Communicator; model: a minidist Module (the same values on every rank, each parameter in
            exactly one layer); loss_fn: e.g. CrossEntropyLoss().
        stage, make_optimizer, bucket_bytes, mixed: the ZeRO attachment's (zero_sync.ZeroSync), e.g.
            ``make_optimizer=lambda shards: SGD(shards, lr=0.1, momentum=0.9)``.
        memory: a MemoryLedger to record held bytes at each point of a step (None: no recording).
    """

    def __init__(self, comm, model, make_optimizer, loss_fn, *, stage: int,
                 bucket_bytes: int | None = DEFAULT_BUCKET_BYTES, memory=None,
                 mixed: ShardedMixedPrecision | None = None):
        params = check_trainer(comm, model, loss_fn)
        seen: dict[int, int] = {}
        for i, layer in enumerate(units(model)):
            for p in layer.parameters():
                if id(p) in seen:
                    raise ValueError(f"{p!r} is shared (layers {seen[id(p)]} and {i}): a sharded wrapper "
                                     "frees and re-gathers each layer's parameters, so a parameter must "
                                     "belong to exactly one layer, once (untie the weights)")
                seen[id(p)] = i
        check_same_layout(comm, params)
        check_same_values(comm, params,
                          "replicas start different: build the model from the same seed on every rank")
        self.comm, self.model, self.loss_fn = comm, model, loss_fn
        # the sync checks stage, mixed and make_optimizer, shards the parameters, builds the optimizer
        self.sync = ZeroSync(model, comm, stage=stage, make_optimizer=make_optimizer,
                             bucket_bytes=bucket_bytes, mixed=mixed)
        self.stage, self.mixed, self.precision = stage, mixed, self.sync.precision
        self.groups, self.optimizer = self.sync.groups, self.sync.optimizer
        completes = sorted(set(ready_layers(self.sync.units, self.sync.buckets)))  # stage 3: every layer
        gathered = " (gathered)" if stage == 3 else ""
        self.recorder = MemoryRecorder(
            memory, self.held, comm, backward_points={i: f"backward layer {i}{gathered}" for i in completes},
            forward_points={i: f"forward layer {i}{gathered}" for i in completes} if stage == 3 else {})
        self.clock = ComputeCharges(comm, overlap=False)
        self.runner = StepRunner(model, loss_fn, [self.sync, self.recorder, self.clock, self.precision])
        self.applied = True                            # did the last step update (False: skipped, Inf/NaN)?

    # -- one global batch ------------------------------------------------------------------------------------
    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward on this rank's shard of the global batch, its loss weighted by n_r / B, then
        the sharded update (ZeroSync.step). x: the global batch (B, ...), the same on every rank, P <= B;
        y: its targets (B, ...).
        Returns this rank's mean loss over its shard.
        """
        self.model.zero_grad()                       # stage 1's flat gradients (stages 2-3: freed already)
        lo, hi = shard_range(self.comm, x, y)
        self.runner.loss_fn = ShardWeightedLoss(self.loss_fn, (hi - lo) / len(x))
        loss = self.runner.forward_backward(x[lo:hi], y[lo:hi])
        self.applied = self.sync.step()
        self.recorder.record("after step")
        return loss

    # -- what a rank holds -----------------------------------------------------------------------------------
    def held(self) -> dict[str, int]:
        """Bytes this rank holds now, by category (sim.memory.held_bytes; fp32 masters: optimizer)."""
        return held_bytes(self.model, self.optimizer, **self.precision.held(self.groups))

    def full_parameters(self) -> list[np.ndarray]:
        """Copies of the full parameters, in model.parameters() order: stages 1-2 hold them; stage 3 gathers
        them (a collective: every rank calls it), the model's Parameters stay freed."""
        with self.sync.gathered():
            return [p.data.copy() for p in self.model.parameters()]

    def master_parameters(self) -> list[np.ndarray]:
        """Mixed precision: the full fp32 masters in model.parameters() order, allgathered from every
        group's master shard (a collective: every rank calls it; its bytes count in comm.stats)."""
        found = {}
        for g in self.groups:
            full = np.concatenate(allgather(self.comm, g.shard.data))
            found.update({id(p): view.copy() for p, view in zip(g.params, g.views(full))})
        return [found[id(p)] for p in self.model.parameters()]

    def largest_layer(self) -> int:
        """max_l Ψ_l: elements of the largest group (stage 3: a layer, gathered whole while it runs)."""
        return max(g.n for g in self.groups)

    def shard_elements(self) -> int:
        """Ψ_r: the elements of this rank's shards (Σ over groups of split_sizes(n, P)[rank])."""
        return sum(g.hi - g.lo for g in self.groups)

    def bytes_per_step(self, applied: bool = True) -> int:
        """Bytes this rank sends per step (the module docstring's; flat.send_bytes): stages 1-2 send no
        allgather when a mixed-precision step was skipped; mixed precision adds the found_inf flag."""
        p, r = self.comm.world_size, self.comm.rank
        allgathers = 2 if self.stage == 3 else int(applied)
        return self.precision.flag_bytes(p, r) + sum(
            flat.send_bytes(g.n, p, r, g.dtype.itemsize, "reduce_scatter")
            + allgathers * flat.send_bytes(g.n, p, r, g.dtype.itemsize, "allgather") for g in self.groups)

    # -- checkpoints ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's optimizer state (its shards), tagged with P, rank and stage (mixed: the fp32 master
        shards and the loss scale too)."""
        state = {"world_size": self.comm.world_size, "rank": self.comm.rank, "stage": self.stage,
                 "optimizer": self.optimizer.state_dict()}
        return {**state, **self.precision.save(self.groups)}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()`` of the same rank of a run with the same P and stage (else ValueError)."""
        if not isinstance(state, dict) or not {"world_size", "rank", "stage", "optimizer"} <= set(state):
            raise ValueError("expected a dict from a sharded wrapper's state_dict() "
                             "(world_size, rank, stage, optimizer)")
        p, r = self.comm.world_size, self.comm.rank
        if state["world_size"] != p or state["rank"] != r:
            raise ValueError(f"this optimizer state holds rank {state['rank']}'s shards of a run with P = "
                             f"{state['world_size']}; this is rank {r} of P = {p}: shards of another P "
                             "cover other elements (gather the full state and re-shard it first)")
        if state["stage"] != self.stage:
            raise ValueError(f"state saved by ZeRO stage {state['stage']}, this is stage {self.stage}")
        mixed = self.precision.keeps_masters
        if ("mixed" in state) != mixed:
            raise ValueError("state saved " + ("with" if "mixed" in state else "without") + " mixed "
                             "precision (fp32 master shards); this wrapper runs "
                             + ("with" if mixed else "without"))
        self.optimizer.load_state_dict(state["optimizer"])
        self.precision.restore(state, self.sync)
