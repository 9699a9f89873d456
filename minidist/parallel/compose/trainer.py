"""The Trainer parallelize returns: train_step(x, y) = gather_loss(local_step(x, y)), each step on the
engine its first step built (build.py). One place each: the batch is cut in ``my_part``, the objective
shared out in ``take_share``, the loss gathered in ``gather_loss``.
"""

from __future__ import annotations

import hashlib

import numpy as np

from minidist.collectives.primitives import pairwise_allreduce
from minidist.nn import MoE
from minidist.nn.runner import backward_through

from ..context.layout import positions
from ..data import GradientSync, ZeroSync
from ..expert import ExpertParallelMoE
from ..shards import ShardWeightedLoss
from .build import build
from .state import full_state


class Trainer:
    """parallelize's result (parallelize's docstring has the recipe). Built on the first step (the context
    axis needs the sequence length) or by ``prepare(seq_len)``. Attributes: model, mesh, micro_batches,
    zero; after prepare: units (the split model's Sequential), runner (pipeline = 1) or pipeline (the
    executor), syncs (the data attachments), optimizer (this rank's; ZeRO: on its shards), held (this
    rank's parameters), labels, position (the pipeline coordinate), seq_len, peak_activation_bytes.
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
        no MoE layer is held): the batch checked, this rank's part of it through the engine (one
        StepRunner over the M micro-batches, or the Pipeline's task table), the optimizer stepped. The
        planner times this part of the step."""
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

    # -- the build (build.py), on the first step -------------------------------------------------------
    def prepare(self, seq_len: int) -> None:
        """Split the model for sequences of seq_len and build the engine (once; collective)."""
        if self.units is None:
            build(self, seq_len)
        elif self.mesh.sizes["context"] > 1 and seq_len != self.seq_len:
            raise ValueError(f"the context axis was built for sequences of {self.seq_len}, got {seq_len}")

    def take_share(self, per_pass: float) -> ShardWeightedLoss:
        """This rank's share 1/(S·C) of the global objective (parallelize's docstring), the one place it is
        scaled: per_pass of it per forward-backward pass; each MoE layer's router-loss coefficients by
        1/(S·C·M) (each micro-batch routes one group), its scaled loss appended to ``router_losses``."""
        s = self.mesh.sizes
        parts = s["data"] * s["expert"] * s["context"]
        for moe in (m for m in self.units.modules() if isinstance(m, (MoE, ExpertParallelMoE))):
            moe.aux_loss_coef /= self.micro_batches * parts
            moe.z_loss_coef /= self.micro_batches * parts
            tally_router_loss(moe, self.router_losses)
        return ShardWeightedLoss(self.loss_fn, per_pass / parts, scale_forward=True)

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


def tally_router_loss(moe, losses: list) -> None:
    """Make moe's forward also append its router loss (already scaled by its share) to ``losses``."""
    forward = moe.forward

    def forward_and_tally(x):
        y = forward(x)
        losses.append(moe.loss)
        return y

    moe.forward = forward_and_tally


# -- the batch: cut in one place -------------------------------------------------------------------
def check_batch(x, y, mesh, micro_batches: int, block_size: int, vocab_size: int, sequence_parallel: bool):
    """x, y as arrays after the checks every rank makes alike; ValueError naming what does not fit."""
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim != 2 or y.shape != x.shape:
        raise ValueError(f"expected tokens and targets of one shape (N, T), got {x.shape}, {y.shape}")
    if x.shape[1] > block_size:
        raise ValueError(f"a sequence of {x.shape[1]} tokens is longer than the model's block_size = "
                         f"{block_size}")
    for name, ids in (("tokens", x), ("targets", y)):
        integer = np.issubdtype(ids.dtype, np.integer)
        if not integer or ids.size and not 0 <= ids.min() <= ids.max() < vocab_size:
            raise ValueError(f"{name} must be integer ids in [0, vocab_size = {vocab_size})")
    s = mesh.sizes
    parts = s["data"] * s["expert"] * micro_batches
    if len(x) % parts:
        raise ValueError(f"a batch of {len(x)} does not split into data × expert × micro_batches = "
                         f"{parts} equal parts")
    if s["context"] > 1 and x.shape[1] % (2 * s["context"]):
        raise ValueError(f"a sequence of {x.shape[1]} does not split into 2·context = "
                         f"{2 * s['context']} zigzag chunks")
    if sequence_parallel and x.shape[1] // s["context"] % s["tensor"]:
        raise ValueError(f"sequence parallelism cuts a rank's {x.shape[1] // s['context']} positions into "
                         f"tensor = {s['tensor']} equal pieces: they do not divide")
    return x, y


def check_same_batch(comm, x: np.ndarray, y: np.ndarray) -> None:
    """ValueError on every rank unless every rank of comm was given the same x and y: a 63-bit digest
    (blake2b) compared by ``comm.all_equal`` — the communicator's own check, not counted in its stats and
    free on the simulated clock (so the planner's prediction of a step is unchanged)."""
    digest = hashlib.blake2b(digest_size=8)
    for a in (x, y):
        digest.update(repr((a.shape, a.dtype.str)).encode())
        digest.update(np.ascontiguousarray(a).tobytes())
    if not comm.all_equal(int.from_bytes(digest.digest(), "little") >> 1):
        raise ValueError("the ranks were given different batches: every rank must be given the whole "
                         "global batch (x, y), the same on all of them (parallelize slices it)")


def my_part(x: np.ndarray, y: np.ndarray, mesh) -> tuple[np.ndarray, np.ndarray]:
    """This rank's rows of the batch (its token set's) and, with a context axis, its zigzag positions."""
    s, at = mesh.sizes, mesh.coords
    sets, n = s["data"] * s["expert"], len(x)
    k = at["data"] * s["expert"] + at["expert"]
    x, y = x[k * n // sets:(k + 1) * n // sets], y[k * n // sets:(k + 1) * n // sets]
    if s["context"] > 1:
        where = positions(x.shape[1], s["context"], at["context"])
        x, y = x[:, where], y[:, where]
    return x, y
