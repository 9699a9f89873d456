"""Pipeline parallelism: a Sequential cut into P stages, one per rank, fed micro-batch by micro-batch.

"Distributed Deep Learning (Part II)" slides ("Pipeline parallelism", "GPipe: Reduce Bubble
with Micro-Batching", "PipeDream"); "Scaling Up Training" slides (micro-batches, gradient checkpointing).

    stage s (rank s) holds layers[b[s]:b[s+1]]                                    (split.py)
    F(s, m): x_m = recv from s−1 (stage 0: the data);  y_m = stage(x_m);  send y_m to s+1
             (last stage: loss_m = L(y_m, t_m) and dy_m = (n_m / N) · dL/dy_m)
    B(s, m): dy_m = recv from s+1 (last stage: from F);  dx_m = stage.backward(dy_m);  send dx_m to s−1
    the order of the F's and B's on stage s is row s of the schedule                (schedule.py)

With micro-batches of n_m of the N samples (minidist.split's sizes) and a loss averaging over its
micro-batch, loss = Σ_m (n_m / N)·loss_m: scaling each micro-batch's output gradient by n_m / N and
letting backward *add* into Parameter.grad gives the full-batch gradient; the optimizer steps once.

Between F(s, m) and B(s, m) the stage keeps m's activations (``checkpoint=True``: only its input, the
rest recomputed in B). BatchNorm normalises per micro-batch (as in GPipe); weights are updated
synchronously once per batch. Kept to the side: ledger.py charges the simulated clock per layer and
records ``timeline``, ``memory`` and ``busy_seconds``; comm.StageLinks pairs a send with the next op's
receive in one sendrecv, so 1F1B's steady state cannot deadlock on a full mailbox.
"""

from __future__ import annotations

import numpy as np

from minidist.checks import check_count
from minidist.nn.checkpoint import Checkpoint, SavedActivations, forward_saving, nbytes_of
from minidist.nn.module import Sequential
from minidist.nn.runner import StepRunner
from minidist.split import split_offsets

from .comm import StageLinks
from .ledger import StageCharges, StageLedger
from .schedule import Op, Schedule, check_schedule, make_schedule, stage_ops
from .split import check_boundaries, layer_costs, split_by_cost, split_by_layers


class Pipeline:
    """This rank's stage of a pipelined Sequential, and the executor that runs a schedule on it.

    comm: the cluster communicator; rank s runs stage s of P = comm.world_size stages.
    model: the whole Sequential (the same on every rank); this rank keeps layers[b[s]:b[s+1]].
    boundaries: "layers" (equal layer counts), "flops" (balanced by forward FLOPs of ``sample``), or a
        list [0, b_1, ..., L] of P + 1 increasing layer indices.
    num_micro_batches: M; schedule: "naive", "gpipe", "1f1b" or a Schedule (list of ticks of Ops).
    checkpoint: recompute activations in backward, for every stage (bool) or per stage (list of bools).
    loss_fn: a loss with forward(prediction, target) -> mean loss and backward() -> dL/dprediction.

    Batch norm is per micro-batch, by choice (as GPipe): a BatchNorm layer in training mode normalises
    each micro-batch of n_m samples with that micro-batch's statistics and updates its running
    estimates M times per step. Its loss and gradients therefore depend on M (M = 1 is full-batch
    training); GroupNorm / LayerNorm / OnlineNorm do not (lessons/12_normalization.py shows both).
    """

    def __init__(self, comm, model: Sequential, *, loss_fn, num_micro_batches: int, schedule="gpipe",
                 boundaries="layers", sample: np.ndarray | None = None, checkpoint=False):
        if not isinstance(model, Sequential):
            raise TypeError(f"a pipeline splits a Sequential, got {type(model).__name__}")
        self.comm, P = comm, comm.world_size
        self.stage, self.num_stages, self.loss_fn = comm.rank, P, loss_fn
        self.boundaries = self._boundaries(model, boundaries, sample)
        self.num_micro_batches = check_count(num_micro_batches, "number of micro-batches")
        if isinstance(schedule, str):
            schedule = make_schedule(schedule, P, num_micro_batches)
        check_schedule(schedule, P, num_micro_batches)
        self.schedule: Schedule = schedule
        flags = [checkpoint] * P if isinstance(checkpoint, bool) else list(checkpoint)
        if len(flags) != P or not all(isinstance(f, bool) for f in flags):
            raise ValueError(f"checkpoint must be a bool or {P} bools (one per stage), got {checkpoint!r}")
        self.checkpointed = flags[self.stage]
        a, b = self.boundaries[self.stage], self.boundaries[self.stage + 1]
        self.module = Sequential(*model.layers[a:b])
        # The units the executor runs and prices one by one: the layers, or one checkpointed segment.
        self.units = [Checkpoint(self.module)] if self.checkpointed else list(self.module.layers)
        self._runner = Sequential(*self.units)  # what forward_saving watches for saved activations
        self.ledger = StageLedger(comm, self.stage)  # clock, timeline, memory: kept to the side
        self.charges = StageCharges(self.ledger.charge)
        self.stage_runner = StepRunner(self._runner, None, [self.charges], input_grad=True)
        self.loss: float | None = None
        self.output: np.ndarray | None = None

    def _boundaries(self, model: Sequential, boundaries, sample) -> list[int]:
        L, P = len(model), self.num_stages
        if isinstance(boundaries, str):
            if boundaries == "layers":
                return split_by_layers(L, P)
            if boundaries == "flops":
                if sample is None:
                    raise ValueError("boundaries='flops' needs sample=, an input batch to price the layers")
                return split_by_cost(layer_costs(model, sample), P)
            raise ValueError(f"boundaries must be 'layers', 'flops' or a list of indices, got {boundaries!r}")
        return check_boundaries(boundaries, L, P)

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    def parameters(self):
        """This stage's parameters (give them to this rank's optimizer)."""
        return self.module.parameters()

    # What running the schedule cost (ledger.py): the ops' (Op, start, end), (time, bytes held) samples,
    # seconds spent computing, and the peak of the activation memory.
    @property
    def timeline(self) -> list[tuple[Op, float, float]]:
        return self.ledger.timeline

    @property
    def memory(self) -> list[tuple[float, int]]:
        return self.ledger.memory

    @property
    def busy_seconds(self) -> float:
        return self.ledger.busy_seconds

    @property
    def peak_activation_bytes(self) -> int:
        return max(nbytes for _, nbytes in self.memory)

    # -- one training step: run my row of the schedule -------------------------------------------------
    def train_step(self, x: np.ndarray, target: np.ndarray, optimizer=None) -> float | None:
        """Zero the gradients, run the schedule over the batch (x, target), step the optimizer once.

        x: the batch, shape (N, ...), read by stage 0; target: shape (N, ...), read by the last stage
        (every rank is given both). Returns the batch's mean loss on the last stage (also kept with the
        output, shape (N, ...), in .loss and .output), None elsewhere.
        """
        M = self.num_micro_batches
        self._x, self._target, self._weight = split_micro_batches(x, target, M)
        self._in_flight: dict[int, tuple[SavedActivations, list[int], np.ndarray | None]] = {}
        self._outputs: dict[int, np.ndarray] = {}
        self._losses: dict[int, float] = {}
        self.module.zero_grad()

        my_row = stage_ops(self.schedule, self.stage)
        self.links = StageLinks(self.comm, my_row)
        for op in my_row:
            if op.kind == "F":
                self._forward(op.micro_batch)
            else:
                self._backward(op.micro_batch)

        if optimizer is not None:
            optimizer.step()
        if not self.is_last:
            return None
        self.output = np.concatenate([self._outputs[m] for m in range(M)])
        self.loss = float(sum(self._weight[m] * self._losses[m] for m in range(M)))
        return self.loss

    def _forward(self, m: int) -> None:
        """F(m): receive x_m, run the stage keeping its activations, send y_m on (last stage: the loss)."""
        x = self._x[m] if self.is_first else self.links.recv_activation(m)
        self.ledger.begin()
        self.charges.label = f"F{m}"           # each unit is charged to the clock as it runs (ledger.py)
        y, saved = forward_saving(self._runner, x, self.stage_runner.forward)
        unit_flops, dy = self.charges.flops, None
        if self.is_last:  # the loss's gradient is known now; keep it (scaled by n_m / N) until B(m)
            self._outputs[m] = y
            self._losses[m] = self.loss_fn.forward(y, self._target[m])
            dy = self.loss_fn.backward() * self._weight[m]
        self._in_flight[m] = (saved, unit_flops, dy)
        self.ledger.forward_done(m, held=self._held_bytes())
        if not self.is_last:
            self.links.send_activation(y, m)

    def _backward(self, m: int) -> None:
        """B(m): receive dy_m, backward through the stage (gradients add up), send dx_m back."""
        saved, unit_flops, dy = self._in_flight[m]
        if not self.is_last:
            dy = self.links.recv_gradient(m)
        self.ledger.begin()
        held = self._held_bytes()
        saved.restore()
        # charged 2× forward per unit, +1× to recompute a checkpointed segment; charges.recomputed: the
        # largest activation such a recompute held for a moment (bytes)
        self.charges.label, self.charges.flops, self.charges.recomputed = f"B{m}", unit_flops, 0
        dx = self.stage_runner.backward(dy)
        saved.release()
        del self._in_flight[m]
        held_during = held + self.charges.recomputed
        self.ledger.backward_done(m, held_during=held_during, held_after=self._held_bytes())
        if not self.is_first:
            self.links.send_gradient(dx, m)

    def _held_bytes(self) -> int:
        """Bytes of the activations (and the last stage's loss gradients) kept between F(m) and B(m)."""
        return nbytes_of([(saved.entries, dy) for saved, _, dy in self._in_flight.values()])


def split_micro_batches(x: np.ndarray, target: np.ndarray, M: int):
    """The batch (x, target), N samples each, as M micro-batches of n_m samples (minidist.split's sizes):
    lists of the M inputs, the M targets and the M weights n_m / N of their losses."""
    N = len(x)
    if len(target) != N:
        raise ValueError(f"x has {N} samples but target has {len(target)}")
    if M > N:
        raise ValueError(f"cannot split a batch of {N} samples into {M} micro-batches (M must be <= N)")
    edges = split_offsets(N, M)
    # Contiguous copies, not views: each micro-batch owns its memory (and is counted as such).
    xs = [x[edges[m]:edges[m + 1]].copy() for m in range(M)]
    targets = [target[edges[m]:edges[m + 1]].copy() for m in range(M)]
    return xs, targets, [(edges[m + 1] - edges[m]) / N for m in range(M)]
