"""Data × pipeline × tensor over one ``comm.split`` grid, for any task table (1F1B, interleaved, ZB-H1, Chimera).

    world rank w = (d·P + p)·t + q     d: data replica (of D), p: pipeline rank (of P), q: tensor rank (of t)
    tensor group    the t ranks of one (d, p): a stage's tensor-parallel units run on them (Megatron blocks:
                    their f/g all-reduces keep each unit's input and output whole on all t ranks)
    pipeline group  the P ranks of one (d, q): TaskPipeline runs the table on them (pipeline/tasks_executor.py),
                    each stage through the step runner
    data group      the D ranks of one (p, q): the same shards in every replica; their gradients are summed by
                    one all-reduce (data/comm.allreduce_gradients) and divided by D before the optimizer steps

Replica d trains on rows [d·N/D, (d+1)·N/D) of the batch (equal slices: N must divide by D), so the mean
of the replicas' gradients is the gradient of the batch's mean loss. A GPT is pipelined as its chain of
units (``gpt_units``): the token and position embeddings as one unit, the blocks (tensor-parallel blocks
with ``tensor_gpt_units``), the final LayerNorm, the head. Cost per step and rank: the pipeline's messages,
the blocks' tensor all-reduces, and 2(D − 1)/D · |W_stage shard| bytes on the data ring.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minidist.nn import GPT, Module, Sequential
from minidist.nn.checkpoint import forward_flops

from .data.comm import allreduce_gradients
from .pipeline.tasks import TaskSchedule
from .pipeline.tasks_executor import TaskPipeline
from .tensor.block import TensorParallelBlock


class GPTInput(Module):
    """A GPT's first unit: tokens (B, T) int -> tok_emb(tokens) + pos_emb(0..T−1), (B, T, d); backward
    adds both tables' gradients and returns None (tokens have none). Shares the GPT's Parameters."""

    def __init__(self, gpt: GPT):
        self.tok_emb, self.pos_emb = gpt.tok_emb, gpt.pos_emb

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return 0                                   # a lookup and an addition: no products to count

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """tokens (B, T) -> (B, T, d)."""
        return self.tok_emb.forward(tokens) + self.pos_emb.forward(np.arange(tokens.shape[1]))

    def backward(self, dy: np.ndarray) -> None:
        """dy (B, T, d); adds into tok_emb.weight.grad and pos_emb.weight.grad."""
        self.tok_emb.backward(dy)
        self.pos_emb.backward(dy.sum(axis=0))


def gpt_units(gpt: GPT) -> Sequential:
    """gpt (dropout 0, untied) as a Sequential: GPTInput, the blocks, ln_f, head (same Parameters)."""
    if gpt.drop.p or gpt.tie_weights:
        raise ValueError("a pipelined GPT needs dropout 0 and untied weights (a tied head lives on two stages)")
    return Sequential(GPTInput(gpt), *gpt.blocks, gpt.ln_f, gpt.head)


class Priced(Module):
    """A unit with a known forward FLOP count (the step runner's clock asks ``flops``): forward and backward
    are ``inner``'s. A tensor-parallel block does 1/t of the whole block's products."""

    def __init__(self, inner: Module, flops: Callable[[tuple[int, ...]], int]):
        self.inner, self._flops = inner, flops

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return self._flops(tuple(input_shape))

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self.inner.forward(x)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        return self.inner.backward(dy)


def tensor_gpt_units(tensor_comm, gpt: GPT) -> Sequential:
    """gpt's units with each block split over tensor_comm (TensorParallelBlock); the embeddings, ln_f and
    the head stay whole on every tensor rank (their gradients agree there: every input is whole)."""
    t = tensor_comm.world_size
    blocks = [Priced(TensorParallelBlock(tensor_comm, b), lambda shape, b=b: forward_flops(b, shape) // t)
              for b in gpt.blocks]
    return Sequential(*gpt_units(gpt).layers[:1], *blocks, gpt.ln_f, gpt.head)


def _check_divides(name: str, value, world_size: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or world_size % value:
        raise ValueError(f"{name} = {value!r} must be an integer >= 1 dividing world_size {world_size}")


class DataPipelineGrid:
    """D data replicas of a P-rank pipeline of t-rank tensor groups over comm (world_size = D·P·t).

    model: the Sequential to pipeline (the same on every rank), or a function tensor_comm -> Sequential
    (e.g. ``lambda c: tensor_gpt_units(c, gpt)``); schedule: a task table for P ranks, num_stages stages,
    num_micro_batches micro-batches; loss_fn: mean loss per micro-batch.
    """

    def __init__(self, comm, model, *, loss_fn, schedule: TaskSchedule, num_stages: int,
                 num_micro_batches: int, data: int, tensor: int = 1):
        _check_divides("data", data, comm.world_size)
        _check_divides("tensor", tensor, comm.world_size // data)
        self.data, self.tensor, self.pipe_size = data, tensor, comm.world_size // (data * tensor)
        rest, self.tensor_rank = divmod(comm.rank, tensor)
        self.replica, self.position = divmod(rest, self.pipe_size)
        self.tensor_comm = comm.split(rest, key=self.tensor_rank)
        self.pipe_comm = comm.split(self.replica * tensor + self.tensor_rank, key=self.position)
        self.data_comm = comm.split(self.position * tensor + self.tensor_rank, key=self.replica)
        self.model = model(self.tensor_comm) if callable(model) and not isinstance(model, Module) else model
        self.pipeline = TaskPipeline(self.pipe_comm, self.model, loss_fn=loss_fn, schedule=schedule,
                                     num_stages=num_stages, num_micro_batches=num_micro_batches)

    def parameters(self):
        return self.pipeline.parameters()

    def train_step(self, x: np.ndarray, target: np.ndarray, optimizer) -> float | None:
        """One step on the batch (x (N, ...), target (N, ...), N divisible by D): the replica's slice through
        its pipeline, the data group's mean gradient, one optimizer step. Returns this rank's share of the
        batch's mean loss (the sum over all ranks is the loss), None if no last stage ran here."""
        N = len(x)
        if N % self.data or len(target) != N:
            raise ValueError(f"a batch of {N} samples (targets {len(target)}) does not split into {self.data} "
                             "equal replica slices")
        rows = slice(self.replica * N // self.data, (self.replica + 1) * N // self.data)
        loss = self.pipeline.train_step(x[rows], target[rows])
        params = self.parameters()
        allreduce_gradients(self.data_comm, params)
        for p in params:
            p.grad /= self.data
        optimizer.step()
        return None if loss is None else loss / self.data
