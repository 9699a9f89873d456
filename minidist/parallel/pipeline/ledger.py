"""The bookkeeping beside a pipeline stage: simulated time, the timeline of its ops, activation memory.

None of this changes what the pipeline computes; it records what running the schedule costs, so a
lesson can draw the bubble ("Distributed Deep Learning (Part II)" slides, "GPipe: Reduce Bubble with
Micro-Batching") and compare the memory of GPipe, 1F1B and gradient checkpointing ("Scaling Up
Training" slides).

    clock      every layer's FLOPs are charged as the layer runs: forward FLOPs in F,
               2× in B, +1× in B when the layer is a checkpointed segment recomputing its forward
    timeline   (Task, start, end) per task, start taken after the task's input arrived
    memory     the bytes of activations held, on the one memory ledger (minidist/sim/memory.py): a
               MemoryLedger of this rank, stamped with the simulated clock; peak = memory.peak("activations")
    busy       seconds the stage spent computing (the rest of the step is bubble or waiting)
"""

from __future__ import annotations

from minidist.nn.checkpoint import Checkpoint, forward_flops
from minidist.nn.runner import Attachment
from minidist.sim.memory import MemoryLedger

from .schedule import Task
from .split_backward import DeferredWeightGrad


class StageLedger:
    """The accounts of one rank's stages: comm (its clock is charged)."""

    def __init__(self, comm):
        self.comm = comm
        self.timeline: list[tuple[Task, float, float]] = []
        self.memory = MemoryLedger(comm.rank)
        self.memory.record("start", {"activations": 0}, comm.clock)
        self.busy_seconds = 0.0
        self._start = comm.clock

    def begin(self) -> None:
        """A task starts now (its input has been received)."""
        self._start = self.comm.clock

    def charge(self, flops: int, label: str) -> None:
        """One layer's work: advance the simulated clock by flops and count the time as busy."""
        start = self.comm.clock
        self.comm.compute(flops, label=label)
        self.busy_seconds += self.comm.clock - start

    def forward_done(self, task: Task, held: int) -> None:
        """F ended; held: bytes of activations kept now, counted from the task's start."""
        self.timeline.append((task, self._start, self.comm.clock))
        self.memory.record(f"{task.kind}{task.micro_batch}.{task.stage} kept", {"activations": held},
                           self._start)

    def backward_done(self, task: Task, held_during: int, held_after: int) -> None:
        """B or W ended; held_during: bytes held while it ran (including what a checkpointed segment
        recomputed), held_after: bytes still held once what it needed was let go."""
        self.timeline.append((task, self._start, self.comm.clock))
        name = f"{task.kind}{task.micro_batch}.{task.stage}"
        self.memory.record(f"{name} running", {"activations": held_during}, self._start)
        self.memory.record(f"{name} done", {"activations": held_after}, self.comm.clock)


class StageCharges(Attachment):
    """The step runner's attachment that charges each unit of a stage as it runs: forward its FLOPs,
    backward twice that (+1× to recompute a checkpointed segment; 1× for a split Linear, whose weight
    gradient W charges). charge(flops, label=...): StageLedger.charge, or a communicator's compute.
    ``flops`` holds the last forward's per-unit FLOPs; ``recomputed`` the largest activation a recompute
    held (bytes)."""

    def __init__(self, charge):
        self.charge, self.label, self.flops, self.recomputed, self.shape = charge, "", [], 0, ()

    def before_forward(self, i, unit, x):
        if i == 0:
            self.flops = []
        self.shape = x.shape
        return x

    def after_forward(self, i, unit, y):
        self.flops.append(forward_flops(unit, self.shape))     # a Checkpoint knows its FLOPs after forward
        self.charge(self.flops[i], label=self.label)
        return y

    def after_backward(self, i, unit, dx):
        times = 1 if isinstance(unit, DeferredWeightGrad) else 2
        recompute = self.flops[i] if isinstance(unit, Checkpoint) else 0
        self.recomputed = max(self.recomputed, getattr(unit, "recompute_nbytes", 0))
        self.charge(times * self.flops[i] + recompute, label=self.label)
        return dx
