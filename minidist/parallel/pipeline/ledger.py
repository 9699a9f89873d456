"""The bookkeeping beside a pipeline stage: simulated time, the timeline of its ops, activation memory.

None of this changes what the pipeline computes; it records what running the schedule costs, so a
lesson can draw the bubble ("Distributed Deep Learning (Part II)" slides, "GPipe: Reduce Bubble with
Micro-Batching") and compare the memory of GPipe, 1F1B and gradient checkpointing ("Scaling Up
Training" slides).

    clock      every layer's FLOPs are charged as the layer runs, by the stage runner's ComputeCharges
               (minidist.sim.compute): forward FLOPs in F, 2× in B, +1× in B when the layer is a
               checkpointed segment recomputing its forward
    timeline   (Task, start, end) per task, start taken after the task's input arrived
    memory     the bytes of activations held, on the one memory ledger (minidist/sim/memory.py): a
               MemoryLedger of this rank, stamped with the simulated clock; peak = memory.peak("activations")
"""

from __future__ import annotations

from minidist.sim.memory import MemoryLedger

from .schedule import Task


class StageLedger:
    """The accounts of one rank's stages: comm (its clock is read)."""

    def __init__(self, comm):
        self.comm = comm
        self.timeline: list[tuple[Task, float, float]] = []
        self.memory = MemoryLedger(comm.rank)
        self.memory.record("start", {"activations": 0}, comm.clock)
        self._start = comm.clock

    def begin(self) -> None:
        """A task starts now (its input has been received)."""
        self._start = self.comm.clock

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

