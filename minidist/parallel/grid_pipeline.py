"""Data × pipeline × context × expert × tensor over one Mesh (mesh.py), for any task table (1F1B,
interleaved, ZB-H1, Chimera).

    world rank w = (((d·P + p)·c + k)·e + j)·t + q   d: data replica (of D), p: pipeline rank (of P),
                    k: context rank (of c), j: expert rank (of e), q: tensor rank (of t) — tensor innermost
    tensor group    the t ranks of one (d, p, k, j): a stage's tensor-parallel units run on them (Megatron
                    blocks: their f/g all-reduces keep each unit's input and output whole on all t ranks)
    context group   the c ranks of one (d, p, j, q): each holds the zigzag positions of every sequence; the
                    blocks run ring attention over the group and sum their gradients over it, the other
                    units' are summed by one all-reduce; each rank's loss counts 1/c
    expert group    the e ranks of one (d, p, k, q): a Switch model's experts spread over them, each with
                    its own rows of the batch (grid_expert.py); at the pipeline's end_backward the
                    AverageGradients attachment averages the replicated parameters over the group
    pipeline group  the P ranks of one (d, k, j, q): TaskPipeline runs the table on them
                    (pipeline/tasks_executor.py), each stage through the step runner
    data group      the D ranks of one (p, k, j, q): the same shards in every replica; their gradients are
                    summed by one all-reduce (data/comm.allreduce_gradients) and divided by D before the
                    optimizer steps — or, with zero1, reduce-scattered, each rank stepping its 1/D of them
                    (ZeRO-1: data/zero.py's update on the ShardGroups of a ZeRO over the group), allgathered

Token set s = d·e + j trains on rows [s·N/S, (s+1)·N/S) of the batch, S = D·e (equal slices: N must divide
by S), so the mean of the sets' gradients is the gradient of the batch's mean loss. A GPT is pipelined as
its chain of units (``gpt_units``): the token and position embeddings as one unit, the blocks
(tensor-parallel blocks with ``tensor_gpt_units``, Switch blocks with grid_expert.switch_units), the final
LayerNorm, the head. Cost per step and rank: the pipeline's messages, the blocks' tensor all-reduces, and
2(D − 1)/D · |W_stage shard| bytes on the data ring (ZeRO-1: a reduce-scatter and an allgather, the same).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minidist.nn import GPT, Module, Sequential
from minidist.nn.checkpoint import forward_flops

from .context.layout import positions
from .data.comm import allreduce_gradients
from .data.zero import ZeRO, zero1_shard_update
from .expert import AverageGradients, ExpertParallelMoE
from .mesh import Mesh
from .pipeline.tasks import TaskSchedule
from .pipeline.tasks_executor import TaskPipeline
from .tensor.block import TensorParallelBlock


class GPTInput(Module):
    """A GPT's first unit: tokens (B, T) int -> tok_emb(tokens) + pos_emb(0..T−1), (B, T, d); backward
    adds both tables' gradients and returns None (tokens have none). Shares the GPT's Parameters."""

    def __init__(self, gpt: GPT, positions: np.ndarray | None = None):
        self.tok_emb, self.pos_emb, self.positions = gpt.tok_emb, gpt.pos_emb, positions

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return 0                                   # a lookup and an addition: no products to count

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """tokens (B, T) -> (B, T, d); with ``positions`` (context parallelism) the tokens are those
        positions'."""
        # a new array each time: what forward keeps per micro-batch is found by comparing attributes
        where = np.arange(tokens.shape[1]) if self.positions is None else self.positions.copy()
        return self.tok_emb.forward(tokens) + self.pos_emb.forward(where)

    def backward(self, dy: np.ndarray) -> None:
        """dy (B, T, d); adds into tok_emb.weight.grad and pos_emb.weight.grad."""
        self.tok_emb.backward(dy)
        self.pos_emb.backward(dy.sum(axis=0))


def gpt_units(gpt: GPT) -> Sequential:
    """gpt (dropout 0, untied) as a Sequential: GPTInput, the blocks, ln_f, head (same Parameters)."""
    if gpt.drop.p or gpt.tie_weights:
        raise ValueError("a pipelined GPT needs dropout 0 and untied weights "
                         "(a tied head lives on two stages)")
    return Sequential(GPTInput(gpt), *gpt.blocks, gpt.ln_f, gpt.head)


class Priced(Module):
    """A unit with a known forward FLOP count (the step runner's clock asks ``flops``): forward and backward
    are ``inner``'s. A tensor-parallel block does 1/t of the whole block's products.

    ``helpers``: objects outside the Module tree that keep what backward needs in ``_saved`` (ring
    attention's RingAttention). Their state is copied onto this unit after forward and put back before
    backward, so a pipeline that holds several micro-batches keeps each one's (checkpoint.forward_saving
    sees attributes of Modules only)."""

    def __init__(self, inner: Module, flops: Callable[[tuple[int, ...]], int], helpers=()):
        self.inner, self._flops, self._helpers = inner, flops, list(helpers)
        self._helper_state: list | None = None

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return self._flops(tuple(input_shape))

    def forward(self, x: np.ndarray) -> np.ndarray:
        y = self.inner.forward(x)
        self._helper_state = [helper._saved for helper in self._helpers]
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray:
        for helper, state in zip(self._helpers, self._helper_state or []):
            helper._saved = state
        return self.inner.backward(dy)


def tensor_gpt_units(tensor_comm, gpt: GPT, context_comm=None, seq_len: int | None = None) -> Sequential:
    """gpt's units with each block split over tensor_comm (TensorParallelBlock); the embeddings, ln_f and
    the head stay whole on every tensor rank (their gradients agree there: every input is whole). With
    context_comm, the blocks also run ring attention over it on this rank's tokens of seq_len (zigzag)."""
    t = tensor_comm.world_size
    where = None if context_comm is None else positions(seq_len, context_comm.world_size, context_comm.rank)
    blocks = []
    for b in gpt.blocks:
        split = TensorParallelBlock(tensor_comm, b, context=context_comm, seq_len=seq_len)
        helpers = [] if split.attn.ring is None else [split.attn.ring]
        blocks.append(Priced(split, lambda shape, b=b: forward_flops(b, shape) // t, helpers))
    return Sequential(GPTInput(gpt, where), *blocks, gpt.ln_f, gpt.head)


class _Share:
    """A loss counted as ``share`` of the whole (a context rank's mean over its T/c tokens: share 1/c)."""

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
    schedule: a task table for P ranks, num_stages stages, num_micro_batches micro-batches; loss_fn: mean
    loss per micro-batch; zero1: shard the optimizer over the data group (build it with build_optimizer).
    """

    def __init__(self, comm, model, *, loss_fn, schedule: TaskSchedule, num_stages: int,
                 num_micro_batches: int, data: int, tensor: int = 1, context: int = 1, expert: int = 1,
                 seq_len: int | None = None, zero1: bool = False):
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
        for moe in (m for m in model.modules() if isinstance(m, ExpertParallelMoE)):
            # a rank's micro-batch (its context positions) is one routing group: scale its router losses by
            # its share of the batch (equal micro-batches), as _Share does the loss
            moe.aux_loss_coef /= num_micro_batches * context
            moe.z_loss_coef /= num_micro_batches * context
        if context > 1:
            loss_fn = _Share(loss_fn, 1 / context)
        self.pipeline = TaskPipeline(self.pipe_comm, self.model, loss_fn=loss_fn, schedule=schedule,
                                     num_stages=num_stages, num_micro_batches=num_micro_batches)
        self.mine = Sequential(*(self.pipeline.stages[k] for k in sorted(self.pipeline.stages)))
        if expert > 1:   # replicated parameters: mean over the expert group; the experts' own: / e
            self.pipeline.attachments.append(AverageGradients(self.expert_comm, self.mine))

    def parameters(self):
        return self.pipeline.parameters()

    def build_optimizer(self, make_optimizer):
        """make_optimizer(parameters) -> optimizer, built on this rank's parameters, or with zero1 on its
        1/D shards of them (a ZeRO stage 1 over the data group: the optimizer state shrinks by D)."""
        if not self.zero1:
            return make_optimizer(self.parameters())
        self.zero = ZeRO(self.data_comm, self.mine, make_optimizer, self.loss_fn, stage=1)
        return self.zero.optimizer

    def train_step(self, x: np.ndarray, target: np.ndarray, optimizer) -> float | None:
        """One step on the batch (x (N, ...), target (N, ...), N divisible by D·e): the token set's slice
        through its pipeline, the data group's mean gradient, one optimizer step. Returns this rank's share
        of the batch's mean loss (the sum over all ranks is the loss), None if no last stage ran here."""
        N, sets = len(x), self.data * self.expert
        if N % sets or len(target) != N:
            raise ValueError(f"a batch of {N} samples (targets {len(target)}) does not split into "
                             f"D·e = {sets} equal token sets")
        if self.zero1 and (self.zero is None or optimizer is not self.zero.optimizer):
            raise ValueError("with zero1 the optimizer must be build_optimizer's (it steps the shards)")
        s = self.replica * self.expert + self.expert_rank
        rows = slice(s * N // sets, (s + 1) * N // sets)
        x, target = x[rows], target[rows]
        if self.context > 1:     # this rank's tokens; the blocks sum their gradients over the context group
            where = positions(self.seq_len, self.context, self.context_rank)
            x, target = x[:, where], target[:, where]
        loss = self.pipeline.train_step(x, target)
        params = self.parameters()
        if self.context > 1:  # the units outside the blocks saw only this rank's tokens: sum over the group
            outside = [p for unit in self.model.layers if not isinstance(unit, Priced)
                       for p in unit.parameters()]
            mine = {id(p) for p in params}
            allreduce_gradients(self.context_comm, [p for p in outside if id(p) in mine])
        if self.zero is not None:     # ZeRO-1: reduce-scatter, step this rank's shards, allgather
            for g in self.zero.groups:
                g.grad /= self.data
            zero1_shard_update(self.data_comm, self.zero.groups, optimizer)
        else:
            allreduce_gradients(self.data_comm, params)
            for p in params:
                p.grad /= self.data
            optimizer.step()
        return None if loss is None else loss / sets
