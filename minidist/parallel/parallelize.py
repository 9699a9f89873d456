"""parallelize(model, mesh, ...): data (ZeRO-1, 2, 3; mixed precision), pipeline (any schedule), tensor
(+ sequence), context and expert parallelism, any subset of them, on one GPT or Switch Transformer and one
Mesh.

    trainer = parallelize(gpt, Mesh(comm, data=2, tensor=2), loss_fn=CrossEntropyLoss(),
                          optimizer=lambda params: AdamW(params, lr=1e-3))
    loss = trainer.train_step(x, y)          # the GLOBAL batch on every rank; the global mean loss back
    state = trainer.full_state_dict()        # = gpt.state_dict() after the same steps in one process

The axes (mesh.py's order): the batch's rows are split over the D·E (data, expert) ranks — token set
s = d·E + j trains rows [s·N/S, (s+1)·N/S), S = D·E — and each row's positions over the C context ranks
(zigzag); the model is cut into units (embeddings, blocks, ln_f, head) and pipelined over P ranks by the
schedule's task table, each stage's blocks split over the tensor group (Megatron), running ring attention
over the context group and, in a Switch model, their experts over the expert group (the transforms, in
place). Each stage's runner carries a GradientSync: the partial sums over the context and expert groups,
then DataParallel's buckets over the data group, sent while the stage's last backward runs (zero=1: one
sum after the table, reduce-scattered, each rank stepping 1/D of the optimizer state).
grid_pipeline.DataPipelineGrid runs it; this file chooses the units and the table, gathers the loss and
the state. Without a pipeline axis, mixed precision, sequence parallelism and ZeRO-2/3 run the split GPT
through one step runner with GradientSync and the MixedPrecisionTrainer, as DataParallel does.

Returned loss: Σ over the ranks of tensor rank 0 of their share of the cross-entropy (a last stage's) plus
their MoE layers' router losses (scaled to their share), summed by one allreduce: the same bits on every
rank.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from minidist.collectives.primitives import pairwise_allreduce
from minidist.nn import GPT, CrossEntropyLoss, MoE, SwitchTransformer
from minidist.nn.runner import StepRunner
from minidist.precision.mixed import MixedPrecisionTrainer

from .context import context_parallel
from .context.layout import positions
from .data import GradientSync
from .expert import ExpertParallelMoE, expert_parallel
from .grid_expert import switch_units
from .grid_pipeline import DataPipelineGrid, LossShare, gpt_units, tensor_gpt_units
from .mesh import Mesh
from .pipeline.registry import SYNCHRONOUS, make_schedule
from .tensor import VocabParallelCrossEntropy, tensor_parallel


def parallelize(model: GPT, mesh: Mesh, *, loss_fn, optimizer, micro_batches: int = 1,
                schedule: str = "1f1b", chunks: int = 2, zero: int = 0, mixed=None,
                sequence_parallel: bool = False) -> Trainer:
    """A Trainer of ``model`` (an unsplit nn.GPT or nn.SwitchTransformer, dropout 0, untied, built the same
    on every rank) over ``mesh``. optimizer: parameters -> optimizer; micro_batches: per token set;
    schedule: a name of pipeline/registry.SYNCHRONOUS (interleaved: ``chunks`` stages per rank); zero: 0, 1,
    2 or 3 (the data axis's ZeRO stage: GradientSync's); mixed: None, or MixedPrecisionTrainer's keywords
    (``dict(fmt=BF16, scaler=...)``: the recipe DataParallel takes, built here on the split model);
    sequence_parallel: the tensor axis also splits the tokens between its all-reduces (Korthikanti et
    al.). Mixed precision, sequence parallelism and ZeRO-2/3 run without a pipeline axis, on one
    micro-batch. ValueError for what the mesh cannot split (module docstring)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a minidist.parallel.Mesh, got {type(mesh).__name__}")
    if not isinstance(model, GPT):
        raise TypeError(f"model must be an nn.GPT or nn.SwitchTransformer, got {type(model).__name__}")
    sizes = mesh.sizes
    if sizes["tensor"] > 1 and model.blocks[0].attn.n_heads % sizes["tensor"]:
        raise ValueError(f"tensor = {sizes['tensor']} must divide the heads ({model.blocks[0].attn.n_heads})")
    switch = isinstance(model, SwitchTransformer)
    if sizes["expert"] > 1 and not switch:
        raise ValueError(f"expert = {sizes['expert']} needs a SwitchTransformer, got a dense "
                         f"{type(model).__name__}")
    if switch:
        check_routing_groups(model, sizes, micro_batches)
    if schedule not in SYNCHRONOUS:
        raise ValueError(f"schedule must be one of {sorted(SYNCHRONOUS)}, got {schedule!r}")
    if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3 (the ZeRO stage of the data axis), got {zero!r}")
    if mixed is not None and not isinstance(mixed, dict):
        raise ValueError(f"mixed must be a dict of MixedPrecisionTrainer's keywords (fmt=...), got {mixed!r}")
    if sequence_parallel and (sizes["tensor"] == 1 or not isinstance(loss_fn, CrossEntropyLoss)):
        raise ValueError("sequence_parallel needs a tensor axis > 1 and loss_fn a CrossEntropyLoss (the head "
                         "is split by vocabulary: VocabParallelCrossEntropy takes its place)")
    if one_runner(mixed, sequence_parallel, zero) and (sizes["pipeline"] > 1 or micro_batches != 1):
        raise ValueError(f"mixed precision, sequence parallelism and ZeRO-2/3 run without a pipeline axis, "
                         f"on one micro-batch; got pipeline = {sizes['pipeline']}, "
                         f"micro_batches = {micro_batches}")
    if mixed is not None and zero:
        raise ValueError(f"mixed precision is composed with zero=0 only, got zero = {zero}")
    options = {"chunks": chunks} if schedule == "interleaved" else {}
    table = make_schedule(schedule, sizes["pipeline"], micro_batches, **options)
    stages = 1 + max(t.stage for tick in table for t in tick)
    return Trainer(model, mesh, loss_fn, optimizer, table, stages, micro_batches, zero, mixed,
                   bool(sequence_parallel))


def check_routing_groups(model, sizes: dict, micro_batches: int) -> None:
    """A Switch model trains like one process only where each rank's micro-batch is one of its routing
    groups: without a context axis ``groups`` must be data × expert × micro_batches; with one, a group is a
    rank's zigzag positions, which no contiguous grouping matches, so routing must not depend on the group
    (nothing dropped: k·capacity_factor >= E, and no balance loss: aux_loss_coef = 0)."""
    moe = model.blocks[0].mlp
    parts = sizes["data"] * sizes["expert"] * micro_batches
    if sizes["context"] == 1 and moe.groups != parts:
        raise ValueError(f"the Switch model routes groups={moe.groups}, but the mesh routes data × expert × "
                         f"micro_batches = {parts} groups (one per rank and micro-batch): build it with "
                         f"groups={parts}")
    if sizes["context"] > 1 and (moe.aux_loss_coef or moe.k * moe.capacity_factor < moe.num_experts):
        raise ValueError("with a context axis a routing group is a rank's zigzag positions, which no "
                         "one-process grouping matches: a Switch model needs aux_loss_coef = 0 and "
                         f"k·capacity_factor >= num_experts (nothing dropped), got aux_loss_coef = "
                         f"{moe.aux_loss_coef}, k·capacity_factor = {moe.k * moe.capacity_factor}, "
                         f"num_experts = {moe.num_experts}")


def one_runner(mixed, sequence_parallel: bool, zero: int) -> bool:
    """Mixed precision, sequence parallelism and ZeRO-2/3 train through one step runner (no pipeline)
    rather than the grid's pipeline executor."""
    return mixed is not None or bool(sequence_parallel) or zero >= 2


class Trainer:
    """parallelize's result: ``train_step(x, y) -> loss`` and ``full_state_dict()``. The grid is built on
    the first step, when the sequence length (which the context axis splits) is known."""

    def __init__(self, model, mesh, loss_fn, make_optimizer, table, stages, micro_batches, zero, mixed,
                 sequence_parallel):
        self.model, self.mesh, self.loss_fn, self.make_optimizer = model, mesh, loss_fn, make_optimizer
        self.table, self.stages, self.micro_batches, self.zero = table, stages, micro_batches, zero
        self.mixed, self.sequence_parallel = mixed, sequence_parallel
        self.grid = self.runner = self.recipe = self.optimizer = self.seq_len = None
        self.router_losses: list[float] = []

    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """x (N, T) tokens, y (N, T) targets: the whole batch, the same on every rank. Returns the global mean
        training objective, bitwise the same on every rank."""
        x, y = np.asarray(x), np.asarray(y)
        if x.ndim != 2 or y.shape != x.shape:
            raise ValueError(f"expected tokens and targets of one shape (N, T), got {x.shape}, {y.shape}")
        s = self.mesh.sizes
        parts = s["data"] * s["expert"] * self.micro_batches
        if len(x) % parts:
            raise ValueError(f"a batch of {len(x)} does not split into data × expert × micro_batches = "
                             f"{parts} equal parts")
        if s["context"] > 1 and x.shape[1] % (2 * s["context"]):
            raise ValueError(f"a sequence of {x.shape[1]} does not split into 2·context = "
                             f"{2 * s['context']} zigzag chunks")
        if self.grid is None and self.runner is None:
            if one_runner(self.mixed, self.sequence_parallel, self.zero):
                self._build_runner(x.shape[1])
            else:
                self._build(x.shape[1])
        elif s["context"] > 1 and x.shape[1] != self.seq_len:
            raise ValueError(f"the context axis was built for sequences of {self.seq_len}, got {x.shape[1]}")
        self.router_losses.clear()
        share = self.grid.train_step(x, y, self.optimizer) if self.runner is None else self._runner_step(x, y)
        mine = 0.0
        if self.mesh.coords["tensor"] == 0:      # the tensor ranks hold the same numbers: count one of them
            mine = (share or 0.0) + sum(self.router_losses)
        return float(pairwise_allreduce(self.mesh.comm, np.array([mine]))[0])

    def _build(self, seq_len: int) -> None:
        s, model, mesh = self.mesh.sizes, self.model, self.mesh
        self.seq_len = seq_len
        self.named = label_elements(model)
        self.grid = DataPipelineGrid(mesh, lambda *groups: split_units(model, mesh, seq_len),
                                     loss_fn=self.loss_fn, schedule=self.table, num_stages=self.stages,
                                     num_micro_batches=self.micro_batches, data=s["data"], tensor=s["tensor"],
                                     context=s["context"], expert=s["expert"], seq_len=seq_len,
                                     zero1=self.zero == 1, overlap=True)
        self._restore(self.grid.parameters())
        self.optimizer = self.grid.build_optimizer(self.make_optimizer)
        for moe in (m for m in self.grid.mine.modules() if isinstance(m, (MoE, ExpertParallelMoE))):
            tally_router_loss(moe, self.router_losses)

    def _build_runner(self, seq_len: int) -> None:
        """No pipeline: one step runner over the split GPT's units with GradientSync (partial sums, the data
        group's buckets, the agreed overflow) and the MixedPrecisionTrainer, as DataParallel's. Sequence
        parallelism splits the whole GPT (the vocabulary too: the loss becomes VocabParallelCrossEntropy)."""
        s, mesh, model = self.mesh.sizes, self.mesh, self.model
        self.seq_len, self.named = seq_len, label_elements(model)
        loss_fn = self.loss_fn
        if self.sequence_parallel:
            tensor_parallel(model, mesh.group("tensor"), sequence_parallel=True)
            if s["context"] > 1:
                context_parallel(model, mesh.group("context"), seq_len=seq_len)
            if s["expert"] > 1:
                expert_parallel(model, mesh.group("expert"))
            loss_fn = VocabParallelCrossEntropy(mesh.group("tensor"), model.vocab_size)
        else:
            split_units(model, mesh, seq_len)                 # in place: the runner steps the GPT's units
        units, sets = model, s["data"] * s["expert"]
        for moe in (m for m in units.modules() if isinstance(m, (MoE, ExpertParallelMoE))):
            moe.aux_loss_coef /= s["context"] * sets           # this rank's share, as the grid's
            moe.z_loss_coef /= s["context"] * sets
            tally_router_loss(moe, self.router_losses)
        self._restore(units.parameters())
        share = LossShare(loss_fn, 1 / (s["context"] * sets))
        if self.zero:                  # the optimizer on this rank's shards (GradientSync's ZeRO)
            self.sync = GradientSync(units, mesh.group("data"), zero=self.zero,
                                     make_optimizer=self.make_optimizer)
            self.optimizer = self.sync.optimizer
        else:
            self.optimizer = self.make_optimizer(self.held)
            if self.mixed is not None:
                self.recipe = MixedPrecisionTrainer(units, self.optimizer, share, **self.mixed)
            self.sync = GradientSync(units, mesh.group("data"), mixed=self.recipe, inf_group=mesh.comm)
        self.runner = StepRunner(units, share, [self.sync] + ([self.recipe] if self.recipe else []))

    def _runner_step(self, x: np.ndarray, y: np.ndarray) -> float:
        s, at = self.mesh.sizes, self.mesh.coords
        sets, n = s["data"] * s["expert"], len(x)
        k = at["data"] * s["expert"] + at["expert"]
        x, y = x[k * n // sets:(k + 1) * n // sets], y[k * n // sets:(k + 1) * n // sets]
        if s["context"] > 1:
            where = positions(self.seq_len, s["context"], at["context"])
            x, y = x[:, where], y[:, where]
        self.model.zero_grad()
        loss = self.runner.forward_backward(x, y)
        if self.recipe is not None or self.zero:
            self.sync.step()          # mixed: agree on an overflow over the mesh; ZeRO: step the shards
        else:
            self.optimizer.step()
        return loss

    def _restore(self, params) -> None:
        self.held = list({id(p): p for p in params}.values())
        self.labels = restore_values(self.named, self.held)
        self.owner = owners(self.mesh.comm, self.labels, sum(v.size for _, _, v in self.named))

    def full_state_dict(self) -> dict[str, np.ndarray]:
        """{name: array}: model.state_dict() of the unsplit model as one process would hold it after the
        same steps, in the model's dtype, on every rank (each element sent by the one rank that owns it)."""
        if self.grid is None and self.runner is None:
            return self.model.state_dict()
        rank = self.mesh.comm.rank
        flat = np.zeros(sum(v.size for _, _, v in self.named))
        with self.sync.gathered() if self.runner is not None else nullcontext():     # (ZeRO-3: freed)
            for p, labels in zip(self.held, self.labels):
                owned = self.owner[labels] == rank
                flat[labels[owned]] = p.data.ravel()[owned]
        flat = pairwise_allreduce(self.mesh.comm, flat)           # one nonzero term per element: exact
        state, start = {}, 0
        for name, _, value in self.named:
            state[name] = flat[start:start + value.size].reshape(value.shape).astype(value.dtype)
            start += value.size
        state.update({name: np.array(b, copy=True) for name, b in self.model.named_buffers()})
        return state


def split_units(model: GPT, mesh: Mesh, seq_len: int):
    """model split in place over the mesh's tensor, context and expert groups, as its units."""
    s = mesh.sizes
    context = mesh.group("context") if s["context"] > 1 else None
    for moe in (b.mlp for b in model.blocks if isinstance(b.mlp, MoE)):
        moe.groups = 1                  # a rank's micro-batch is one routing group (as ExpertParallelMoE's)
    if s["expert"] > 1:
        return switch_units(mesh.group("tensor"), context, mesh.group("expert"), model, seq_len)
    if s["tensor"] > 1 or context is not None:
        return tensor_gpt_units(mesh.group("tensor"), model, context, seq_len)
    return gpt_units(model)


def label_elements(model) -> list[tuple[str, object, np.ndarray]]:
    """Replace every parameter's values by float64 labels 0, 1, 2, ... (its elements' offsets in the
    concatenation of model.named_parameters()), so that after splitting each split parameter's values say
    which elements of the model it holds. Returns [(name, parameter, its original values)]."""
    named, start = [], 0
    for name, p in model.named_parameters():
        named.append((name, p, p.data))
        p.data = np.arange(start, start + p.size, dtype=np.float64).reshape(p.shape)
        start += p.size
    return named


def restore_values(named: list, held: list) -> list[np.ndarray]:
    """Read the labels of each held (split) parameter, then give it (and the unsplit parameters) the real
    values and a zero gradient of their dtype. Returns each held parameter's labels, flat (int64)."""
    values = np.concatenate([v.ravel() for _, _, v in named])
    labels = [p.data.ravel().astype(np.int64) for p in held]
    for _, p, value in named:
        p.data = value
    for p, where in zip(held, labels):
        p.data = values[where].reshape(p.shape)
        p.grad = np.zeros_like(p.data)
    return labels


def owners(comm, labels: list[np.ndarray], total: int) -> np.ndarray:
    """owner[i]: the lowest rank holding element i of the model (an allreduce of min over the world)."""
    mine = np.full(total, float(comm.world_size))
    for where in labels:
        mine[where] = comm.rank
    owner = pairwise_allreduce(comm, mine, op="min").astype(np.int64)
    if (owner == comm.world_size).any():
        raise RuntimeError(f"{int((owner == comm.world_size).sum())} elements of the model are on no rank")
    return owner


def tally_router_loss(moe: ExpertParallelMoE, losses: list) -> None:
    """Make moe's forward also append its router loss (already scaled by its share) to ``losses``."""
    forward = moe.forward

    def forward_and_tally(x):
        y = forward(x)
        losses.append(moe.loss)
        return y

    moe.forward = forward_and_tally
