"""Data × pipeline × context × expert × tensor over one Mesh (mesh.py), for any task table (1F1B,
interleaved, ZB-H1, Chimera): the model split by the transforms, pipelined, its gradients synchronised.

    world rank w = (((d·P + p)·c + k)·e + j)·t + q   d: data replica (of D), p: pipeline rank (of P),
                    k: context rank (of c), j: expert rank (of e), q: tensor rank (of t) — tensor innermost
    tensor group    each block split by ``tensor_parallel`` (Megatron: its f/g all-reduces keep each
                    unit's input and output whole on all t ranks); the embeddings, ln_f, head stay whole
    context group   ``context_parallel``: each rank holds the zigzag positions of every sequence, the
                    blocks run ring attention over the group; every gradient is a partial sum over it
    expert group    ``expert_parallel`` of a Switch model (grid_expert.py): E/e experts per rank, each
                    rank its own rows; every parameter but the experts' is a partial sum over the group
    pipeline group  pipeline/'s Pipeline runs the table on them, each stage through the step runner
    data group      the same shards in every replica: GradientSync sums their gradients after the table
                    (one bucket per 25 MiB on the ring), or with zero1 reduce-scatters them at the step,
                    each rank stepping its 1/D (ZeRO-1), and allgathers the parameters

Token set s = d·e + j trains on rows [s·N/S, (s+1)·N/S) of the batch, S = D·e (equal slices: N must divide
by S). Each rank's loss is its share 1/(S·c) of the batch's mean (its router losses 1/(S·c·M) per
micro-batch), so the sums over the context and expert groups (``partial_over``: one pairwise all-reduce
per group after the table) and the data group give the gradient of the batch's mean loss. A GPT is
pipelined as its units (``nn.GPT.units``): the embeddings as one unit, the blocks, ln_f, the head.
Cost per step and rank: the pipeline's messages, the blocks' tensor all-reduces, 2(c − 1)/c·|W_stage| and
2(e − 1)/e·|W_replicated| on the context and expert groups, 2(D − 1)/D·|W_stage| on the data ring.
"""

from __future__ import annotations

import numpy as np

from minidist.nn import GPT, Module, Sequential

from .context import context_parallel
from .context.layout import positions
from .data import GradientSync
from .data.comm import DEFAULT_BUCKET_BYTES
from .expert import ExpertParallelMoE
from .mesh import Mesh
from .pipeline.pipeline import Pipeline
from .pipeline.schedule import Schedule
from .tensor import tensor_parallel


def gpt_units(gpt: GPT) -> Sequential:
    """gpt (dropout 0, untied) as a Sequential of its units (nn.GPT.units: the same Parameters)."""
    if gpt.drop.p or gpt.tie_weights:
        raise ValueError("a pipelined GPT needs dropout 0 and untied weights "
                         "(a tied head lives on two stages)")
    return Sequential(*gpt.units())


def split_gpt(tensor_comm, gpt: GPT, context_comm=None, seq_len: int | None = None) -> Sequential:
    """gpt (dropout 0, untied) split in place — each block by ``tensor_parallel`` over tensor_comm, the
    sequence by ``context_parallel`` over context_comm (zigzag of seq_len) — as its units. A split block
    prices itself: its ``flops`` sums its split sub-modules' shares (1/t of the whole block's when t
    divides the heads and d_ff). The embeddings, ln_f and the head stay whole."""
    gpt_units(gpt)                                             # dropout 0, untied
    for b in gpt.blocks:
        tensor_parallel(b, tensor_comm)
    if context_comm is not None:
        context_parallel(gpt, context_comm, seq_len=seq_len)
    return gpt_units(gpt)


def tensor_gpt_units(tensor_comm, gpt: GPT, context_comm=None, seq_len: int | None = None) -> Sequential:
    """gpt's units with each block split over tensor_comm (and, with context_comm, ring attention over it
    on this rank's zigzag tokens of seq_len): ``split_gpt``."""
    return split_gpt(tensor_comm, gpt, context_comm, seq_len)


class LossShare:
    """A loss counted as ``share`` of the whole (a rank's mean over its tokens of the S·c token sets)."""

    def __init__(self, loss_fn, share: float):
        self.loss_fn, self.share = loss_fn, share

    def forward(self, y, target):
        return self.share * self.loss_fn.forward(y, target)

    def backward(self):
        return self.share * self.loss_fn.backward()


def _check_divides(name: str, value, world_size: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or world_size % value:
        raise ValueError(f"{name} = {value!r} must be an integer >= 1 dividing world_size {world_size}")


class DataPipelineGrid:
    """D data replicas of a P-rank pipeline of c·e·t-rank context × expert × tensor groups over comm
    (world_size = D·P·c·e·t), its ranks and groups a Mesh's (comm may be that Mesh).

    model: the Sequential to pipeline (the same on every rank), or a function tensor_comm -> Sequential
    (e.g. ``lambda c: tensor_gpt_units(c, gpt)``), (tensor_comm, context_comm) -> Sequential with context > 1,
    (tensor_comm, context_comm or None, expert_comm) -> Sequential with expert > 1 (grid_expert.switch_units);
    schedule: a task table (or a name of pipeline/registry.py) for P ranks, num_stages stages,
    num_micro_batches micro-batches; loss_fn: mean loss per micro-batch; zero1: shard the optimizer over the
    data group (build it with build_optimizer); overlap: each stage's runner gets a GradientSync (buckets of
    bucket_bytes sent as the stage's last backward completes them, partial sums per unit) instead of one
    sum after the table (which is what the planner's minidist mode prices).
    """

    def __init__(self, comm, model, *, loss_fn, schedule: Schedule, num_stages: int,
                 num_micro_batches: int, data: int, tensor: int = 1, context: int = 1, expert: int = 1,
                 seq_len: int | None = None, zero1: bool = False, overlap: bool = False,
                 bucket_bytes: int | None = DEFAULT_BUCKET_BYTES):
        mesh = comm if isinstance(comm, Mesh) else None
        comm = comm.comm if mesh else comm
        _check_divides("data", data, comm.world_size)
        _check_divides("tensor", tensor, comm.world_size // data)
        _check_divides("context", context, comm.world_size // (data * tensor))
        _check_divides("expert", expert, comm.world_size // (data * tensor * context))
        if context > 1 and (seq_len is None or seq_len % (2 * context)):
            raise ValueError(f"context = {context} needs seq_len, a multiple of 2·context (zigzag), "
                             f"got {seq_len!r}")
        self.data, self.tensor, self.context, self.expert = data, tensor, context, expert
        self.seq_len = seq_len
        self.loss_fn, self.zero1, self.zero = loss_fn, bool(zero1), None
        self.pipe_size = comm.world_size // (data * tensor * context * expert)
        sizes = dict(data=data, pipeline=self.pipe_size, context=context, expert=expert, tensor=tensor)
        if mesh is not None and mesh.sizes != sizes:
            raise ValueError(f"the mesh's sizes {mesh.sizes} are not the grid's {sizes}")
        self.mesh = mesh or Mesh(comm, **sizes)
        at = self.mesh.coords
        self.replica, self.position, self.context_rank = at["data"], at["pipeline"], at["context"]
        self.expert_rank, self.tensor_rank = at["expert"], at["tensor"]
        self.tensor_comm, self.context_comm, self.expert_comm, self.pipe_comm, self.data_comm = (
            self.mesh.group(axis) for axis in ("tensor", "context", "expert", "pipeline", "data"))
        if callable(model) and not isinstance(model, Module):
            contexts = self.context_comm if context > 1 else None
            model = model(self.tensor_comm, contexts, self.expert_comm) if expert > 1 else \
                model(self.tensor_comm, self.context_comm) if context > 1 else model(self.tensor_comm)
        self.model = model
        sets = data * expert
        for moe in (m for m in model.modules() if isinstance(m, ExpertParallelMoE)):
            # a rank's micro-batch (its context positions) is one routing group: scale its router losses by
            # its share of the batch (equal micro-batches), as LossShare does the loss
            moe.aux_loss_coef /= num_micro_batches * context * sets
            moe.z_loss_coef /= num_micro_batches * context * sets
        self.overlap, self.stage_syncs = bool(overlap) and not self.zero1, []

        def stage_sync(k, stage):     # DataParallel's buckets, sent while the stage's last backward runs
            self.stage_syncs.append(GradientSync(stage, self.data_comm, bucket_bytes=bucket_bytes))
            return self.stage_syncs[-1:]

        self.pipeline = Pipeline(self.pipe_comm, self.model, loss_fn=LossShare(loss_fn, 1 / (context * sets)),
                                 schedule=schedule, num_stages=num_stages,
                                 num_micro_batches=num_micro_batches,
                                 stage_attachments=stage_sync if self.overlap else None)
        self.mine = Sequential(*(self.pipeline.stages[k] for k in sorted(self.pipeline.stages)))
        self.sync = None
        if not self.zero1 and not self.overlap:      # the data group's sum, after the table (end_backward)
            self.sync = GradientSync(self.mine, self.data_comm, bucket_bytes=bucket_bytes)
            self.pipeline.attachments.append(self.sync)

    def parameters(self):
        return self.pipeline.parameters()

    def build_optimizer(self, make_optimizer):
        """make_optimizer(parameters) -> optimizer, built on this rank's parameters, or with zero1 on its
        1/D shards of them (GradientSync's ZeRO-1 over the data group: the optimizer state shrinks by D)."""
        if not self.zero1:
            return make_optimizer(self.parameters())
        self.sync = self.zero = GradientSync(self.mine, self.data_comm, zero=1, make_optimizer=make_optimizer)
        self.pipeline.attachments.append(self.sync)
        return self.sync.optimizer

    def train_step(self, x: np.ndarray, target: np.ndarray, optimizer) -> float | None:
        """One step on the batch (x (N, ...), target (N, ...), N divisible by D·e): the token set's slice
        through its pipeline, the partial sums and the data group's sum, one optimizer step. Returns this
        rank's share of the batch's mean loss (the sum over all ranks is the loss), None if no last stage
        ran here."""
        N, sets = len(x), self.data * self.expert
        if N % sets or len(target) != N:
            raise ValueError(f"a batch of {N} samples (targets {len(target)}) does not split into "
                             f"D·e = {sets} equal token sets")
        if self.zero1 and (self.zero is None or optimizer is not self.zero.optimizer):
            raise ValueError("with zero1 the optimizer must be build_optimizer's (it steps the shards)")
        s = self.replica * self.expert + self.expert_rank
        rows = slice(s * N // sets, (s + 1) * N // sets)
        x, target = x[rows], target[rows]
        if self.context > 1:     # this rank's tokens
            where = positions(self.seq_len, self.context, self.context_rank)
            x, target = x[:, where], target[:, where]
        loss = self.pipeline.train_step(x, target)    # GradientSync: partial sums, data sum (zero1: at step)
        if self.zero1:
            self.sync.step()                              # reduce-scatter, step the shards, allgather
        else:
            optimizer.step()
        return loss
