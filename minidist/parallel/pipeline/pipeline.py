"""Pipeline parallelism: a Sequential cut into S stages, run micro-batch by micro-batch from a table.

"Distributed Deep Learning (Part II)" slides ("Pipeline parallelism", "GPipe: Reduce Bubble
with Micro-Batching", "PipeDream"); "Scaling Up Training" slides (micro-batches, gradient checkpointing).

    stage k holds layers[b[k]:b[k+1]] (boundaries.py); rank r keeps the stages its tasks name
    F(m, k)  x_m = the data (k = 0) or stage k − 1's output;  y_m = stage k (x_m);  sent to stage k + 1
             (last stage: loss_m = L(y_m, t_m) and dy_m = (n_m / N) · dL/dy_m, kept for B)
    B(m, k)  dy_m from stage k + 1 (last stage: from F);  dx_m = backward of stage k;  sent to stage k − 1.
             With W tasks in the table the Linears' backward gives dx only (zero_bubble.py) and
    W(m, k)  adds the weight gradients B left for it
    the order of the tasks on rank r is row r of the table (schedule.py; names: registry.py)

With micro-batches of n_m of the N samples (minidist.collectives.pieces's sizes) and a loss averaging over its
micro-batch, loss = Σ_m (n_m / N)·loss_m: scaling each micro-batch's output gradient by n_m / N and
letting backward *add* into Parameter.grad gives the full-batch gradient; the optimizer steps once.

Each stage runs through its own step runner (minidist/nn/runner.py); only the stage's last backward task
of the step passes ``last=True``, so a stage's gradient sync runs once per step, overlapped with that
backward (a table with W tasks: an empty pass after the stage's last W). A stage held by two ranks
(Chimera) sums its two gradients (one exchange) before the optimizer steps. Between F(m, k) and B(m, k)
the rank keeps m's activations (``checkpoint``: only the stage's input, the rest recomputed in B).
Kept to the side: ``busy_seconds`` (the clock, charged per layer), ``timeline`` (task, start, end) and
``memory`` (the activation bytes held), to draw the bubble and compare GPipe, 1F1B and checkpointing.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.pieces import split_offsets
from minidist.nn.checkpoint import Checkpoint, forward_saving
from minidist.nn.checks import check_count
from minidist.nn.linear import Linear
from minidist.nn.module import Sequential
from minidist.nn.nbytes import nbytes_of
from minidist.nn.runner import StepRunner, backward_through
from minidist.sim.compute import ComputeCharges
from minidist.sim.memory import MemoryLedger

from .boundaries import check_boundaries, layer_costs, split_by_cost, split_by_layers
from .comm import StageLinks
from .registry import make_schedule
from .schedule import Schedule, Task, check_tasks, stage_ops
from .zero_bubble import DeferredWeightGrad


class Pipeline:
    """This rank's stages of a pipelined Sequential, and the executor that runs a table on them.

    comm: the communicator; P = comm.world_size ranks. model: the whole Sequential (the same on every rank).
    loss_fn: forward(prediction, target) -> mean loss, backward() -> dL/dprediction.
    num_micro_batches: M. schedule: a registry.SCHEDULES name or a table; num_stages: S (default: the table's)
    boundaries: "layers" (equal layer counts), "flops" (balanced by forward FLOPs of ``sample``), or a
        list [0, b_1, ..., L] of S + 1 increasing layer indices.
    checkpoint: recompute activations in backward, for every stage (bool) or per stage (S bools).
    stage_attachments: a function (stage k, its Sequential) -> runner attachments for that stage (e.g.
        a data group's GradientSync). ``attachments``: step-level ones (empty at first), given one empty
        backward pass after the table (their end_backward).

    BatchNorm is per micro-batch, as in GPipe: its statistics are each micro-batch's and its running
    estimates are updated M times per step (GroupNorm / LayerNorm do not depend on M: lesson 12).
    """

    def __init__(self, comm, model: Sequential, *, loss_fn, num_micro_batches: int, schedule="gpipe",
                 num_stages: int | None = None, boundaries="layers", sample: np.ndarray | None = None,
                 checkpoint=False, stage_attachments=None):
        if not isinstance(model, Sequential):
            raise TypeError(f"a pipeline splits a Sequential, got {type(model).__name__}")
        self.comm, self.loss_fn, P = comm, loss_fn, comm.world_size
        self.M = check_count(num_micro_batches, "number of micro-batches")
        table = make_schedule(schedule, P, self.M) if isinstance(schedule, str) else schedule
        self.S = S = num_stages or max([t.stage + 1 for tick in table for t in tick], default=P)
        self.boundaries = self._boundaries(model, boundaries, sample)
        check_tasks(table, P, S, self.M)
        self.schedule: Schedule = table
        flags = [checkpoint] * S if isinstance(checkpoint, bool) else list(checkpoint)
        if len(flags) != S or not all(isinstance(f, bool) for f in flags):
            raise ValueError(f"checkpoint must be a bool or {S} bools (one per stage), got {checkpoint!r}")
        self.rank_of = {(t.micro_batch, t.stage): t.rank for tick in table for t in tick}
        self.split = any(t.kind == "W" for tick in table for t in tick)
        self.my_tasks = stage_ops(table, comm.rank)
        done = "W" if self.split else "B"        # the task after which a stage's gradients are complete
        self.last_of = {k: [t for t in self.my_tasks if t.stage == k and t.kind == done][-1]
                        for k in {t.stage for t in self.my_tasks}}
        self.several = len({(t.rank, t.stage) for tick in table for t in tick}) > P
        self.timeline: list[tuple[Task, float, float]] = []
        self.memory = MemoryLedger(comm.rank)
        self.memory.record("start", {"activations": 0}, comm.clock)
        self._start = comm.clock                 # when the running task started (its input had arrived)
        self.charges = ComputeCharges(comm, overlap=False, after=True, label="")   # the clock, busy seconds
        self.stages: dict[int, Sequential] = {}
        self.runners: dict[int, StepRunner] = {}
        for k in sorted(self.last_of):
            self.stages[k] = Sequential(*model.layers[self.boundaries[k]:self.boundaries[k + 1]])
            units = [Checkpoint(self.stages[k])] if flags[k] else [
                DeferredWeightGrad(layer) if self.split and isinstance(layer, Linear) else layer
                for layer in self.stages[k].layers]
            mine = list(stage_attachments(k, self.stages[k])) if stage_attachments else []
            self.runners[k] = StepRunner(Sequential(*units), None, [*mine, self.charges], input_grad=True)
        self.stage = min(self.stages) if self.stages else None        # one stage per rank: its index
        self.attachments = []
        self.loss: float | None = None
        self.output: np.ndarray | None = None

    def _boundaries(self, model: Sequential, boundaries, sample) -> list[int]:
        L, S = len(model), self.S
        if isinstance(boundaries, str):
            if boundaries == "layers":
                return split_by_layers(L, S)
            if boundaries == "flops":
                if sample is None:
                    raise ValueError("boundaries='flops' needs sample=, an input batch to price the layers")
                return split_by_cost(layer_costs(model, sample), S)
            raise ValueError(f"boundaries must be 'layers', 'flops' or a list of indices, got {boundaries!r}")
        return check_boundaries(boundaries, L, S)

    def parameters(self):
        """The parameters of this rank's stages (give them to this rank's optimizer)."""
        return [p for k in sorted(self.stages) for p in self.stages[k].parameters()]

    # What running the table cost: seconds spent computing, the peak of the activation memory.
    @property
    def busy_seconds(self) -> float:
        return self.charges.busy_seconds

    @property
    def peak_activation_bytes(self) -> int:
        return self.memory.peak("activations")

    def held_activations(self) -> int:
        """Bytes held now for backward: the saved activations of the micro-batches in flight, the loss
        gradients kept for B, the (x, dy) waiting for W (a view counts through its base, once)."""
        saved = [(entries.entries, dy) for entries, _, dy in self._saved.values()]
        waiting = [pending for units in self._deferred.values() for _, pending, _ in units]
        return nbytes_of(saved, waiting)

    def _done(self, task: Task, held: int, held_after: int | None = None) -> None:
        """Book a finished task: (task, start, end) on the timeline; the activation bytes held from its start
        (F: kept for B; B, W: while running, recomputing included) and, for B and W, after it."""
        name = f"{task.kind}{task.micro_batch}.{task.stage}"
        self.timeline.append((task, self._start, self.comm.clock))
        if held_after is None:
            self.memory.record(f"{name} kept", {"activations": held}, self._start)
        else:
            self.memory.record(f"{name} running", {"activations": held}, self._start)
            self.memory.record(f"{name} done", {"activations": held_after}, self.comm.clock)

    # -- one training step: run my row of the table --------------------------------------------------------
    def train_step(self, x: np.ndarray, target: np.ndarray, optimizer=None) -> float | None:
        """Zero the gradients, run this rank's row of the table over the batch (x (N, ...), target (N, ...),
        given to every rank), sum replicated stages' gradients, step the optimizer once. Returns (and keeps
        in .loss) Σ (n_m / N)·loss_m over the micro-batches whose last stage ran here, None if none did;
        .output: the last stage's output (N, ...) when every micro-batch's ran here."""
        self._x, self._target, self._weight = split_micro_batches(x, target, self.M)
        self._saved, self._deferred, self._losses, self._outputs = {}, {}, {}, {}
        for stage in self.stages.values():
            stage.zero_grad()
        self.links = StageLinks(self.comm, self.schedule, self.rank_of, self.S)
        for task in self.my_tasks:
            self.charges.label = f"{task.kind}{task.micro_batch}" + (f".{task.stage}" if self.several else "")
            {"F": self._forward, "B": self._backward, "W": self._weight_grad}[task.kind](task)
        self._sum_replicas()
        backward_through([], None, self.attachments)      # step-level attachments: every gradient is in
        if optimizer is not None:
            optimizer.step()
        if not self._losses:
            return None
        if len(self._outputs) == self.M:
            self.output = np.concatenate([self._outputs[m] for m in range(self.M)])
        self.loss = float(sum(self._weight[m] * loss for m, loss in sorted(self._losses.items())))
        return self.loss

    def _forward(self, task: Task) -> None:
        """F(m, k): receive x_m, run the stage keeping its activations, send y_m on (last stage: the loss)."""
        m, k = task.micro_batch, task.stage
        x = self._x[m] if k == 0 else self.links.recv(task)
        self._start = self.comm.clock
        y, saved = forward_saving(self.runners[k].model, x, self.runners[k].forward)
        dy = None
        if k == self.S - 1:   # the loss's gradient is known now; keep it (scaled by n_m / N) until B
            self._outputs[m] = y
            self._losses[m] = self.loss_fn.forward(y, self._target[m])
            dy = self.loss_fn.backward() * self._weight[m]
            for a in reversed(self.runners[k].attachments):      # the runner's loss event (loss scaling)
                dy = a.after_loss(dy)
        self._saved[m, k] = (saved, self.charges.flops, dy)
        self._done(task, self.held_activations())
        self.links.send(task, y)

    def _backward(self, task: Task) -> None:
        """B(m, k): receive dy_m, backward through the stage (gradients add up), send dx_m back."""
        m, k = task.micro_batch, task.stage
        saved, flops, dy = self._saved[m, k]
        if k < self.S - 1:
            dy = self.links.recv(task)
        self._start = self.comm.clock
        held = self.held_activations()
        saved.restore()
        # charged 2× forward per unit (1× for a split Linear), +1× to recompute a checkpointed segment;
        # charges.recomputed: the largest activation such a recompute held for a moment (bytes)
        self.charges.flops, self.charges.recomputed = flops, 0
        runner = self.runners[k]
        dx = runner.backward(dy, last=self.last_of[k] == task)
        saved.release()
        del self._saved[m, k]
        if self.split:   # what W will need: each split Linear's (x, dy), and the FLOPs to charge
            self._deferred[m, k] = [(unit, unit.pending, f) for unit, f in zip(runner.layers, flops)
                                    if isinstance(unit, DeferredWeightGrad)]
        self._done(task, held + self.charges.recomputed, self.held_activations())
        self.links.send(task, dx)

    def _weight_grad(self, task: Task) -> None:
        """W(m, k): the weight gradients B left; after the stage's last W, its gradient sync (empty pass)."""
        self._start = self.comm.clock
        held = self.held_activations()
        for unit, pending, flops in self._deferred.pop((task.micro_batch, task.stage)):
            unit.weight_grad(pending)
            self.charges.charge(flops, label=self.charges.label)
        if self.last_of[task.stage] == task:
            backward_through([], None, self.runners[task.stage].attachments)
        self._done(task, held, self.held_activations())

    def _sum_replicas(self) -> None:
        """A stage on two ranks (Chimera): both add the other's gradients (a + b == b + a: bitwise alike)."""
        for k in sorted(self.stages):
            others = sorted({r for (_, s), r in self.rank_of.items() if s == k and r != self.comm.rank})
            if len(others) > 1:
                raise ValueError(f"stage {k} is held by {len(others) + 1} ranks; only pairs are summed here")
            for p in self.stages[k].parameters() if others else []:
                tag = 2 * self.M * self.S        # after every pipeline tag; the pair's order keeps them apart
                theirs = self.comm.sendrecv(p.grad, others[0], others[0], sendtag=tag, recvtag=tag)
                p.grad[...] += theirs      # in place: two summed gradients add to a summed one (not partial)


def split_micro_batches(x: np.ndarray, target: np.ndarray, M: int):
    """The batch (x, target), N samples each, as M micro-batches of n_m samples (collectives.pieces's sizes):
    lists of the M inputs, the M targets and the M weights n_m / N (Python floats) of their losses."""
    N = len(x)
    if len(target) != N:
        raise ValueError(f"x has {N} samples but target has {len(target)}")
    if M > N:
        raise ValueError(f"cannot split a batch of {N} samples into {M} micro-batches (M must be <= N)")
    edges = split_offsets(N, M)
    # Contiguous copies, not views: each micro-batch owns its memory (and is counted as such).
    xs = [x[edges[m]:edges[m + 1]].copy() for m in range(M)]
    targets = [target[edges[m]:edges[m + 1]].copy() for m in range(M)]
    # Python floats: a NumPy float64 weight would turn a float32 model's gradients into float64
    return xs, targets, [int(edges[m + 1] - edges[m]) / N for m in range(M)]
