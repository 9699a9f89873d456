"""Running a table of tasks (tasks.py) on the cluster: several stages per rank, a split backward, replicas.

    the model      a Sequential cut into S stages of equal layer counts; rank r keeps the stages its
                   tasks name (interleaved: r, r + P, ...; Chimera: r and P − 1 − r)
    F(m, k)        x = the data (k = 0) or stage k − 1's output, received from the rank that ran it;
                   y = stage k (x); sent to the rank of (m, k + 1) (the last stage: the loss, its gradient
                   scaled by n_m / N, kept for B)
    B(m, k)        dy from (m, k + 1); dx = backward of stage k; sent to the rank of (m, k − 1). With W
                   tasks in the table the Linears' backward gives dx only (split_backward.py) and
    W(m, k)        adds the weight gradients B left for it
    replicas       a stage held by two ranks (Chimera) sums its two gradients (one exchange) before the
                   optimizer steps, so both copies stay equal
    attachments    step-level runner attachments: each stage's runner ends a backward per micro-batch, so
                   their ``end_backward`` fires once, after the whole table (every gradient is in)

Messages between two ranks are read in the order the sender sent them (the cluster's channels are FIFO):
the receiver knows the sender's row of the table, so a message that arrives before it is needed waits in
``Inbox``. Sends are eager; a pair of ranks must not have more messages outstanding than the mailbox has
slots (16), which the small tables here respect. The clock is charged per layer: F its FLOPs, B 2× (1×
for a split Linear), W 1×. After each task ``memory`` gets (clock, bytes held for backward): the saved
activations of the micro-batches in flight, the loss gradients kept for B, the (x, dy) waiting for W.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from minidist.nn.checkpoint import forward_saving, nbytes_of
from minidist.nn.linear import Linear
from minidist.nn.module import Sequential
from minidist.nn.runner import StepRunner

from .ledger import StageCharges
from .pipeline import split_micro_batches
from .split import split_by_layers
from .split_backward import DeferredWeightGrad
from .tasks import Task, TaskSchedule, check_tasks, rank_tasks


class Inbox:
    """This rank's incoming messages, read from each sender in the order it sends them (tags: the table)."""

    def __init__(self, comm, schedule: TaskSchedule, rank_of: dict, num_stages: int):
        self.comm, self.local, self.early = comm, {}, {}
        self.expected: dict[int, deque] = {}
        for src in range(comm.world_size):
            if src != comm.rank:
                sends = [(dst, tag) for task in rank_tasks(schedule, src)
                         for dst, tag in message_of(task, rank_of, num_stages)]
                self.expected[src] = deque(tag for dst, tag in sends if dst == comm.rank)

    def get(self, src: int, tag: int) -> np.ndarray:
        if src == self.comm.rank:
            return self.local.pop(tag)
        while tag not in self.early:
            next_tag = self.expected[src].popleft()
            self.early[next_tag] = self.comm.recv(src, tag=next_tag)
        return self.early.pop(tag)


def message_of(task: Task, rank_of: dict, num_stages: int) -> list[tuple[int, int]]:
    """(destination rank, tag) of what task sends: F an activation to stage k + 1, B a gradient to k − 1.
    Tag 2·(m·S + receiving stage) for an activation, + 1 for a gradient: unique within a step."""
    _, kind, m, k = task
    if kind == "F" and k < num_stages - 1:
        return [(rank_of[m, k + 1], 2 * (m * num_stages + k + 1))]
    if kind == "B" and k > 0:
        return [(rank_of[m, k - 1], 2 * (m * num_stages + k - 1) + 1)]
    return []


class TaskPipeline:
    """This rank's stages of a Sequential cut into ``num_stages`` stages, and the executor of a task table.

    comm: the communicator (P = world_size ranks); model: the whole Sequential (the same on every rank);
    schedule: a table of Tasks (interleaved_schedule, zero_bubble_schedule, chimera_schedule, from_ops(...))
    for P ranks, num_stages stages and num_micro_batches micro-batches; loss_fn: forward(y, t) -> mean loss;
    attachments: objects with ``end_backward()`` (an Attachment), fired in reverse order after the table.
    """

    def __init__(self, comm, model: Sequential, *, loss_fn, schedule: TaskSchedule, num_stages: int,
                 num_micro_batches: int, attachments=()):
        if not isinstance(model, Sequential):
            raise TypeError(f"a pipeline splits a Sequential, got {type(model).__name__}")
        check_tasks(schedule, comm.world_size, num_stages, num_micro_batches)
        self.comm, self.loss_fn, self.schedule = comm, loss_fn, schedule
        self.S, self.M = num_stages, num_micro_batches
        self.rank_of = {(t.micro_batch, t.stage): t.rank for tick in schedule for t in tick}
        self.split = any(t.kind == "W" for tick in schedule for t in tick)
        self.my_tasks = rank_tasks(schedule, comm.rank)
        bounds = split_by_layers(len(model), num_stages)
        self.holders = {k: sorted({r for (_, s), r in self.rank_of.items() if s == k})
                        for k in range(num_stages)}
        self.charges = StageCharges(comm.compute)
        self.stages: dict[int, Sequential] = {}
        self.runners: dict[int, StepRunner] = {}
        for k in sorted({t.stage for t in self.my_tasks}):
            layers = [DeferredWeightGrad(layer) if self.split and isinstance(layer, Linear) else layer
                      for layer in model.layers[bounds[k]:bounds[k + 1]]]
            self.stages[k] = Sequential(*layers)
            self.runners[k] = StepRunner(self.stages[k], None, [self.charges], input_grad=True)
        self.attachments = list(attachments)
        self.timeline: list[tuple[Task, float, float]] = []
        self.memory: list[tuple[float, int]] = []

    def held_activations(self) -> int:
        """Bytes held now for backward (see the module docstring; a view counts through its base, once)."""
        saved = [([value for _, _, value in entries.entries], dy) for entries, _, dy in self._saved.values()]
        waiting = [pending for units in self._deferred.values() for _, pending, _ in units]
        return nbytes_of(saved, waiting)

    def parameters(self):
        """The parameters of this rank's stages (give them to this rank's optimizer)."""
        return [p for k in sorted(self.stages) for p in self.stages[k].parameters()]

    def train_step(self, x: np.ndarray, target: np.ndarray, optimizer=None) -> float | None:
        """Run this rank's row of the table over the batch (x (N, ...), target (N, ...)), sum replicated
        stages' gradients, step the optimizer. Returns Σ (n_m / N)·loss_m over the micro-batches whose
        last stage ran here (the batch's loss is the sum over ranks), None if none did."""
        self._x, self._target, self._weight = split_micro_batches(x, target, self.M)
        self._saved, self._deferred, self._losses = {}, {}, {}
        for stage in self.stages.values():
            stage.zero_grad()
        self.inbox = Inbox(self.comm, self.schedule, self.rank_of, self.S)
        for task in self.my_tasks:
            start = self.comm.clock
            self.charges.label = f"{task.kind}{task.micro_batch}.{task.stage}"
            {"F": self._forward, "B": self._backward, "W": self._weight_grad}[task.kind](task)
            self.timeline.append((task, start, self.comm.clock))
            self.memory.append((self.comm.clock, self.held_activations()))
        self._sum_replicas()
        for a in reversed(self.attachments):
            a.end_backward()
        if optimizer is not None:
            optimizer.step()
        if not self._losses:
            return None
        return float(sum(self._weight[m] * loss for m, loss in sorted(self._losses.items())))

    def _send(self, task: Task, array: np.ndarray) -> None:
        for dst, tag in message_of(task, self.rank_of, self.S):
            if dst == self.comm.rank:
                self.inbox.local[tag] = array
            else:
                self.comm.send(np.ascontiguousarray(array), dst, tag=tag)

    def _forward(self, task: Task) -> None:
        m, k = task.micro_batch, task.stage
        x = self._x[m] if k == 0 else self.inbox.get(self.rank_of[m, k - 1], 2 * (m * self.S + k))
        y, saved = forward_saving(self.stages[k], x, self.runners[k].forward)
        dy = None
        if k == self.S - 1:
            self._losses[m] = self.loss_fn.forward(y, self._target[m])
            dy = self.loss_fn.backward() * self._weight[m]
        self._saved[m, k] = (saved, list(self.charges.flops), dy)
        self._send(task, y)

    def _backward(self, task: Task) -> None:
        m, k = task.micro_batch, task.stage
        saved, flops, dy = self._saved.pop((m, k))
        if k < self.S - 1:
            dy = self.inbox.get(self.rank_of[m, k + 1], 2 * (m * self.S + k) + 1)
        saved.restore()
        self.charges.flops = flops
        dx = self.runners[k].backward(dy)
        saved.release()
        if self.split:   # what W will need: each split Linear's (x, dy), and the FLOPs to charge
            self._deferred[m, k] = [(unit, unit.pending, f) for unit, f in zip(self.runners[k].layers, flops)
                                    if isinstance(unit, DeferredWeightGrad)]
        self._send(task, dx)

    def _weight_grad(self, task: Task) -> None:
        for unit, pending, flops in self._deferred.pop((task.micro_batch, task.stage)):
            unit.weight_grad(pending)
            self.comm.compute(flops, label=self.charges.label)

    def _sum_replicas(self) -> None:
        """A stage on two ranks (Chimera): both add the other's gradients (a + b == b + a: bitwise alike)."""
        for k in sorted(self.stages):
            others = [r for r in self.holders[k] if r != self.comm.rank]
            if len(others) > 1:
                raise ValueError(f"stage {k} is held by {len(others) + 1} ranks; only pairs are summed here")
            for p in self.stages[k].parameters() if others else []:
                tag = 2 * self.M * self.S        # after every pipeline tag; the pair's order keeps them apart
                p.grad += self.comm.sendrecv(p.grad, others[0], others[0], sendtag=tag, recvtag=tag)
