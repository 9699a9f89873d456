"""Data × pipeline over one ``comm.split`` grid, for any task table (1F1B, interleaved, ZB-H1, Chimera).

    world rank w = d·P + p      d: the data replica (of D), p: the rank inside its pipeline (of P)
    pipeline group  ranks d·P … d·P + P − 1: TaskPipeline runs the table on them (pipeline/tasks_executor.py),
                    each stage through the step runner
    data group      ranks p, P + p, …: the same stages in every replica; their gradients are summed by one
                    all-reduce (data/comm.allreduce_gradients) and divided by D before the optimizer steps

Replica d trains on rows [d·N/D, (d+1)·N/D) of the batch (equal slices: N must divide by D), so the mean
of the replicas' gradients is the gradient of the batch's mean loss. A GPT is pipelined as its chain of
units (``gpt_units``): the token and position embeddings as one unit, the blocks, the final LayerNorm,
the head. Cost per step and rank: the pipeline's messages, plus 2(D − 1)/D · |W_stage| bytes on the data ring.
"""

from __future__ import annotations

import numpy as np

from minidist.nn import GPT, Module, Sequential

from .data.comm import allreduce_gradients
from .pipeline.tasks import TaskSchedule
from .pipeline.tasks_executor import TaskPipeline


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


class DataPipelineGrid:
    """D data replicas of a P-rank pipeline over comm (world_size = D·P).

    model: the Sequential to pipeline (the same on every rank); schedule: a task table for P ranks,
    num_stages stages, num_micro_batches micro-batches; loss_fn: mean loss per micro-batch.
    """

    def __init__(self, comm, model: Sequential, *, loss_fn, schedule: TaskSchedule, num_stages: int,
                 num_micro_batches: int, data: int):
        if isinstance(data, bool) or not isinstance(data, int) or data < 1 or comm.world_size % data:
            raise ValueError(f"data = {data!r} must be an integer >= 1 dividing world_size {comm.world_size}")
        self.data, self.pipe_size = data, comm.world_size // data
        self.replica, self.position = divmod(comm.rank, self.pipe_size)
        self.pipe_comm = comm.split(self.replica, key=self.position)
        self.data_comm = comm.split(self.position, key=self.replica)
        self.pipeline = TaskPipeline(self.pipe_comm, model, loss_fn=loss_fn, schedule=schedule,
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
