"""The Trainer parallelize returns: one engine per pipeline size, over the units split_for_mesh made.

    pipeline = 1   one StepRunner steps the units through the rank's micro-batches (gradient
                   accumulation: only the last pass is ``last``), with its attachments: the data
                   attachment (the partial sums, then over the data group DDP's buckets, GradientSync, or
                   ZeRO-1/2/3, ZeroSync), mixed precision (MixedPrecisionTrainer), the clock
                   (ComputeCharges: forward charged after each unit, backward 2× at once, as a pipeline
                   stage is charged) and the activation peak (ActivationPeak: what the stage's ledger
                   would count)
    pipeline > 1   the Pipeline executor (pipeline/pipeline.py) runs the task table over the same units,
                   each stage through its own StepRunner; its data attachment per stage (sent while the
                   stage's last backward runs) or once after the table (overlap=False, ZeRO-1)

With overlap=False (and ZeRO-1) the data attachment runs after the step's backward passes, in one empty
pass: every partial sum and the data group's reduction once the compute is done, the step the planner's
minidist mode prices (plan/minidist_mode.py). The batch is cut in batch.py, the objective shared out in
``take_share``, the loss gathered in ``gather_loss``: one place each.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.primitives import pairwise_allreduce
from minidist.nn import MoE, Sequential
from minidist.nn.checkpoint import assigned_since
from minidist.nn.nbytes import nbytes_of
from minidist.nn.runner import Attachment, StepRunner, backward_through
from minidist.precision.mixed import MixedPrecisionTrainer
from minidist.sim.compute import ComputeCharges

from ..data import GradientSync, ZeroSync
from ..expert import ExpertParallelMoE
from ..pipeline.pipeline import Pipeline
from ..shards import ShardWeightedLoss
from .batch import check_batch, check_same_batch, my_part
from .split_model import split_for_mesh
from .state import full_state, label_elements, owners, restore_values


class Trainer:
    """parallelize's result (parallelize's docstring has the recipe).

    train_step(x, y) -> the global objective; full_state_dict() -> the unsplit model's state. Built on the
    first step (the context axis needs the sequence length) or by ``prepare(seq_len)``. Attributes: model,
    mesh, micro_batches, zero; after prepare: units (the split model's Sequential), runner (pipeline = 1)
    or pipeline (the executor), syncs (the data attachments), optimizer (this rank's; ZeRO: on its
    shards), held (this rank's parameters), labels, position (the pipeline coordinate), seq_len,
    peak_activation_bytes (the most bytes held for backward after any forward).
    """

    def __init__(self, model, mesh, *, loss_fn, make_optimizer, table, micro_batches: int, zero: int,
                 mixed, sequence_parallel: bool, overlap: bool, bucket_bytes):
        self.model, self.mesh, self.loss_fn, self.make_optimizer = model, mesh, loss_fn, make_optimizer
        self.table, self.micro_batches, self.zero, self.mixed = table, micro_batches, zero, mixed
        self.sequence_parallel, self.overlap, self.bucket_bytes = sequence_parallel, overlap, bucket_bytes
        self.position = mesh.coords["pipeline"]
        self.units = self.runner = self.pipeline = self.recipe = self.optimizer = self.seq_len = None
        self.syncs: list[GradientSync | ZeroSync] = []
        self.router_losses: list[float] = []

    # -- one step ---------------------------------------------------------------------------------------
    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """x (N, T) token ids, y (N, T) targets: the whole global batch, the same on every rank (checked).
        Returns the one-process objective on it: loss_fn's mean over the batch (cross-entropy) plus the
        MoE layers' router losses (Σ_l α·aux_l + β·z_l, SwitchTransformer.router_loss: one process's
        ``loss_fn.forward(model.forward(x), y) + model.router_loss``), bitwise the same on every rank."""
        return self.gather_loss(self.local_step(x, y))

    def local_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """train_step without the gather: this rank's share of the objective (0 where no last stage ran and
        no MoE layer is held). The planner times this part of the step."""
        x, y = check_batch(x, y, self.mesh, self.micro_batches, self.model.block_size, self.model.vocab_size,
                           self.sequence_parallel)
        check_same_batch(self.mesh.comm, x, y)
        self.prepare(x.shape[1])
        x, y = my_part(x, y, self.mesh)
        self.router_losses.clear()
        loss = self._one_stage(x, y) if self.pipeline is None else self.pipeline.train_step(x, y)
        if self.zero or self.recipe is not None:
            self.syncs[-1].step()     # ZeRO: step the shards; mixed: the agreed overflow, then the step
        else:
            self.optimizer.step()
        return (loss or 0.0) + sum(self.router_losses)

    def gather_loss(self, share: float) -> float:
        """Σ over the ranks of tensor rank 0 (the tensor ranks hold the same numbers) of their shares, by
        one allreduce over the mesh: the same bits on every rank."""
        mine = share if self.mesh.coords["tensor"] == 0 else 0.0
        return float(pairwise_allreduce(self.mesh.comm, np.array([mine]))[0])

    def _one_stage(self, x: np.ndarray, y: np.ndarray) -> float:
        """One pipeline rank: M forward-backward passes of the runner (gradients add up; the data
        attachment syncs on the last), then the data attachment after them if it waits for the compute."""
        self.units.zero_grad()
        n, M, loss = len(x) // self.micro_batches, self.micro_batches, 0.0
        for m in range(M):      # equal micro-batches, copies (each owns its memory, as the executor's)
            rows = slice(m * n, (m + 1) * n)
            loss += self.runner.forward_backward(x[rows].copy(), y[rows].copy(), last=m == M - 1)
        if self.after_passes:
            backward_through([], None, self.after_passes)      # the data attachment, after the compute
        return loss

    # -- the build --------------------------------------------------------------------------------------
    def prepare(self, seq_len: int) -> None:
        """Split the model for sequences of seq_len and build the engine (once; collective)."""
        if self.units is not None:
            if self.mesh.sizes["context"] > 1 and seq_len != self.seq_len:
                raise ValueError(f"the context axis was built for sequences of {self.seq_len}, got {seq_len}")
            return
        self.seq_len, self.named = seq_len, label_elements(self.model)
        self.units = split_for_mesh(self.model, self.mesh, seq_len, sequence_parallel=self.sequence_parallel)
        per_pass = 1.0 if self.table is not None else 1 / self.micro_batches   # the executor weights by 1/M
        self.loss = take_share(self.units, self.loss_fn, self.mesh, self.micro_batches, per_pass,
                               self.router_losses)
        if self.table is None:
            self._build_one_stage()
        else:
            self._build_pipeline()

    def _restore(self, params) -> None:
        self.held = list({id(p): p for p in params}.values())
        self.labels = restore_values(self.named, self.held)
        self.owner = owners(self.mesh.comm, self.labels, sum(v.size for _, _, v in self.named))

    def _build_one_stage(self) -> None:
        self._restore(self.units.parameters())
        in_runner = self.zero >= 2 or self.mixed is not None or (self.zero == 0 and self.overlap)
        if self.zero:
            sync = self.data_attachment(self.units, zero=self.zero)
            self.optimizer = sync.optimizer
        else:
            self.optimizer = self.make_optimizer(self.held)
            if self.mixed is not None:
                whole = Sequential(self.units)       # casts at the model's input and output, as on the GPT
                self.recipe = MixedPrecisionTrainer(whole, self.optimizer, self.loss, **self.mixed)
            sync = self.data_attachment(self.units, mixed=self.recipe, overlap=self.overlap)
        self.activations = ActivationPeak(self.units)
        clock = ComputeCharges(self.mesh.comm, overlap=False, after=True, label="")
        attachments = ([sync] if in_runner else []) + ([self.recipe] if self.recipe else [])
        self.runner = StepRunner(self.units, self.loss, [*attachments, clock, self.activations])
        self.after_passes = [] if in_runner else [sync]

    def _build_pipeline(self) -> None:
        stage_sync = None
        if self.zero == 0 and self.overlap:         # each stage's buckets sent while its last backward runs
            def stage_sync(k, stage):
                return [self.data_attachment(stage)]
        self.pipeline = Pipeline(self.mesh.group("pipeline"), self.units, loss_fn=self.loss,
                                 schedule=self.table, num_micro_batches=self.micro_batches,
                                 stage_attachments=stage_sync)
        self._restore(self.pipeline.parameters())
        mine = Sequential(*(self.pipeline.stages[k] for k in sorted(self.pipeline.stages)))
        if self.zero or not self.overlap:           # once after the table (ZeRO-1: reduce-scatter at step)
            self.pipeline.attachments.append(self.data_attachment(mine, zero=self.zero, overlap=False))
        self.optimizer = self.syncs[-1].optimizer if self.zero else self.make_optimizer(self.held)

    def data_attachment(self, module, *, zero: int = 0, mixed=None,
                        overlap: bool = True) -> GradientSync | ZeroSync:
        """The data axis's attachment on ``module``'s parameters (the one place it is built): partial sums,
        then DDP's buckets (zero=0) or the ZeRO stage over the data group."""
        data = self.mesh.group("data")
        if zero:
            sync = ZeroSync(module, data, stage=zero, make_optimizer=self.make_optimizer,
                            bucket_bytes=self.bucket_bytes)
        else:
            sync = GradientSync(module, data, bucket_bytes=self.bucket_bytes, overlap=overlap, mixed=mixed,
                                inf_group=self.mesh.comm)
        self.syncs.append(sync)
        return sync

    # -- what the step left -------------------------------------------------------------------------------
    @property
    def peak_activation_bytes(self) -> int:
        """The most bytes this rank held for backward after any forward of its steps (a pipeline: after
        any task, its ledger's peak), the loss gradient included."""
        if self.pipeline is not None:
            return self.pipeline.peak_activation_bytes
        return self.activations.peak if self.runner is not None else 0

    def full_state_dict(self) -> dict[str, np.ndarray]:
        """{name: array}: model.state_dict() of the unsplit model as one process would hold it after the
        same steps, in the model's dtype, on every rank (each element sent by the one rank that owns it)."""
        if self.units is None:
            return self.model.state_dict()
        comm, buffers = self.mesh.comm, list(self.model.named_buffers())
        if self.zero == 3:
            with self.syncs[-1].gathered():             # ZeRO-3: the parameters gathered, freed after
                return full_state(comm, self.named, self.held, self.labels, self.owner, buffers)
        return full_state(comm, self.named, self.held, self.labels, self.owner, buffers)


def take_share(units, loss_fn, mesh, micro_batches: int, per_pass: float, tally: list) -> ShardWeightedLoss:
    """This rank's share of the global objective, the one place it is scaled: its token set's 1/S of the
    rows (S = data × expert) and its 1/C of the positions, per_pass of it per forward-backward pass; each
    MoE layer's router-loss coefficients by 1/(S·C·M) (each micro-batch routes one group), its scaled
    loss appended to ``tally`` at every forward. Sums over the ranks give one process's objective."""
    s = mesh.sizes
    parts = s["data"] * s["expert"] * s["context"]
    for moe in (m for m in units.modules() if isinstance(m, (MoE, ExpertParallelMoE))):
        moe.aux_loss_coef /= micro_batches * parts
        moe.z_loss_coef /= micro_batches * parts
        tally_router_loss(moe, tally)
    return ShardWeightedLoss(loss_fn, per_pass / parts, scale_forward=True)


def tally_router_loss(moe, losses: list) -> None:
    """Make moe's forward also append its router loss (already scaled by its share) to ``losses``."""
    forward = moe.forward

    def forward_and_tally(x):
        y = forward(x)
        losses.append(moe.loss)
        return y

    moe.forward = forward_and_tally


class ActivationPeak(Attachment):
    """The runner's peak of activation bytes, counted as a pipeline stage's ledger counts them: after each
    forward, the attributes the units assigned since the pass began (nn.checkpoint's rule) and the loss
    gradient; released after the backward, as the executor releases a micro-batch's."""

    def __init__(self, model):
        self.modules, self.peak, self.saved = model.modules(), 0, None

    def begin(self, runner) -> None:
        self.before = [(m, dict(vars(m))) for m in self.modules]

    def after_loss(self, dy):
        self.saved = assigned_since(self.before)
        self.peak = max(self.peak, nbytes_of([(self.saved.entries, dy)]))
        return dy

    def end_backward(self) -> None:
        if self.saved is not None:
            self.saved.release()
            self.saved = None
