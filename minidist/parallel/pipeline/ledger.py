"""The bookkeeping beside a pipeline stage: simulated time, the timeline of its ops, activation memory.

None of this changes what the pipeline computes; it records what running the schedule costs, so a
lesson can draw the bubble ("Distributed Deep Learning (Part II)" slides, "GPipe: Reduce Bubble with
Micro-Batching") and compare the memory of GPipe, 1F1B and gradient checkpointing ("Scaling Up
Training" slides).

    clock      every layer's FLOPs are charged as the layer runs, by the stage runner's ComputeCharges
               (minidist.sim.compute): forward FLOPs in F, 2× in B, +1× in B when the layer is a
               checkpointed segment recomputing its forward
    timeline   (Task, start, end) per task, start taken after the task's input arrived
    memory     (time, bytes of activations held) samples; peak = max over the samples
    busy       seconds the stage spent computing (the rest of the step is bubble or waiting)
"""

from __future__ import annotations

from .schedule import Task


class StageLedger:
    """The accounts of one rank's stages: comm (its clock is read)."""

    def __init__(self, comm):
        self.comm = comm
        self.timeline: list[tuple[Task, float, float]] = []
        self.memory: list[tuple[float, int]] = [(comm.clock, 0)]
        self._start = comm.clock

    def begin(self) -> None:
        """A task starts now (its input has been received)."""
        self._start = self.comm.clock

    def forward_done(self, task: Task, held: int) -> None:
        """F ended; held: bytes of activations kept now, counted from the task's start."""
        self.timeline.append((task, self._start, self.comm.clock))
        self.memory.append((self._start, held))

    def backward_done(self, task: Task, held_during: int, held_after: int) -> None:
        """B or W ended; held_during: bytes held while it ran (including what a checkpointed segment
        recomputed), held_after: bytes still held once what it needed was let go."""
        self.timeline.append((task, self._start, self.comm.clock))
        self.memory += [(self._start, held_during), (self.comm.clock, held_after)]
