"""What ZeRO (stages 1-2, zero.py) and FSDP (stage 3, fsdp.py) share: the checks of their arguments, the
gradient sync that shards and reduces (sync.GradientSync with zero=stage), the step runner it attaches
to, the bytes a rank holds, Ψ_r and the optimizer state of its shards.

A subclass calls ``ShardedWrapper.__init__`` first (it checks and binds the precision), then ``_attach``.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import allgather
from minidist.nn.runner import StepRunner, units
from minidist.sim.compute import ComputeCharges
from minidist.sim.memory import MemoryRecorder, held_bytes

from ..shards import ShardWeightedLoss, check_trainer, shard_range
from . import flat
from .replicas import check_same_layout, check_same_values
from .sync import GradientSync
from .zero_mixed import check_mixed


class ShardedWrapper:
    """The bookkeeping common to every ZeRO stage (not a wrapper on its own: see ZeRO and FSDP), and the
    step runner: [the gradient sync, the memory recorder (it sees a layer's gathered parameters or full
    gradient before the sync frees them), the compute clock (no overlap), the precision]."""

    def __init__(self, comm, model, make_optimizer, loss_fn, algorithm: str, memory, mixed):
        """Check everything before anything changes: TypeError for a wrong comm / model / make_optimizer /
        loss_fn / mixed, ValueError for a model without parameters, a parameter shared by two layers,
        replicas that differ or another algorithm than the ring (whose chunking the shards follow)."""
        params = check_trainer(comm, model, loss_fn)
        if not callable(make_optimizer) or hasattr(make_optimizer, "step"):
            raise TypeError("make_optimizer must be a function params -> optimizer (e.g. lambda ps: "
                            f"Adam(ps, lr=1e-3)), got {type(make_optimizer).__name__}: the optimizer is "
                            "built on this rank's shards")
        self.layers = units(model)
        seen: dict[int, int] = {}
        for i, layer in enumerate(self.layers):
            for p in layer.parameters():
                if id(p) in seen:
                    raise ValueError(f"{p!r} is shared (layers {seen[id(p)]} and {i}): a sharded wrapper "
                                     "frees and re-gathers each layer's parameters, so a parameter must "
                                     "belong to exactly one layer, once (untie the weights)")
                seen[id(p)] = i
        check_same_layout(comm, params)
        check_same_values(comm, params,
                          "replicas start different: build the model from the same seed on every rank")
        if algorithm != "ring":
            raise ValueError("sharded data parallelism uses ring reduce_scatter/allgather; got algorithm "
                             f"{algorithm!r}")
        self.mixed, self.precision = mixed, check_mixed(mixed)
        self.precision.bind(model, params)
        self.comm, self.model, self.loss_fn, self.memory = comm, model, loss_fn, memory

    def _attach(self, make_optimizer, forward_points: dict[int, str], backward_points: dict[int, str],
                **sync_options) -> None:
        """The gradient sync (it shards the parameters and builds the optimizer on the shards) and the
        runner; the memory recorder records after the layers of these {index: label}."""
        self.sync = GradientSync(self.model, self.comm, zero=self.stage, mixed=self.precision,
                                 make_optimizer=make_optimizer, **sync_options)
        self.groups, self.optimizer = self.sync.groups, self.sync.optimizer
        self.clock = ComputeCharges(self.comm, overlap=False)
        self.recorder = MemoryRecorder(self.memory, self.held, self.comm, forward_points=forward_points,
                                       backward_points=backward_points)
        self.runner = StepRunner(self.model, self.loss_fn, [self.sync, self.recorder, self.clock,
                                                            self.precision])
        self.applied = True                            # did the last step update (False: skipped, Inf/NaN)?

    def _forward_backward(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward of this rank's shard of the global batch (x, y) through the runner, its
        loss weighted by (hi − lo)/B."""
        lo, hi = shard_range(self.comm, x, y)
        self.runner.loss_fn = ShardWeightedLoss(self.loss_fn, (hi - lo) / len(x))
        return self.runner.forward_backward(x[lo:hi], y[lo:hi])

    def _update(self) -> bool:
        """The sharded update (sync.step): the optimizer on the shards, whose .grad holds this rank's piece
        of the summed gradient (mixed precision: unless a rank found Inf/NaN); then the parameters follow."""
        self.applied = self.sync.step()
        self.recorder.record("after step")
        return self.applied

    def share_masters(self) -> None:
        """The parameters follow the updated shards (sync.GradientSync.share_masters)."""
        self.sync.share_masters()

    @property
    def compute_spans(self) -> list:
        """The compute stream's spans on the simulated clock (forward and backward of each layer)."""
        return self.clock.spans

    def held(self) -> dict[str, int]:
        """Bytes this rank holds now, by category (sim.memory.held_bytes; fp32 masters: optimizer)."""
        return held_bytes(self.model, self.optimizer, **self.precision.held(self.groups))

    def _gather_full(self, piece) -> list[np.ndarray]:
        """Copies of the full parameters in model.parameters() order, allgathered from every group's
        ``piece(g)`` (a collective: every rank calls it; its bytes count in comm.stats)."""
        found = {}
        for g in self.groups:
            full = np.concatenate(allgather(self.comm, piece(g)))
            found.update({id(p): view.copy() for p, view in zip(g.params, g.views(full))})
        return [found[id(p)] for p in self.model.parameters()]

    def master_parameters(self) -> list[np.ndarray]:
        """Mixed precision: the full fp32 masters in model.parameters() order (a collective)."""
        return self._gather_full(lambda g: g.shard.data)

    def _bytes_sent(self, allgathers: int) -> int:
        """Bytes this rank sends per step: one reduce-scatter and ``allgathers`` allgathers of every group
        (flat.send_bytes), and with mixed precision the found_inf flag."""
        p, r = self.comm.world_size, self.comm.rank
        return self.precision.flag_bytes(p, r) + sum(
            flat.send_bytes(g.n, p, r, g.dtype.itemsize, "reduce_scatter")
            + allgathers * flat.send_bytes(g.n, p, r, g.dtype.itemsize, "allgather") for g in self.groups)

    def shard_elements(self) -> int:
        """Ψ_r: the elements of this rank's shards (Σ over groups of split_sizes(n, P)[rank])."""
        return sum(g.hi - g.lo for g in self.groups)

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
        self.precision.restore(state, self)
