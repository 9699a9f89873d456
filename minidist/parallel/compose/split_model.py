"""split_for_mesh: the one way to split a GPT or a Switch Transformer for a mesh, into its units.

The transforms, applied in place one after another to the same model (each swaps sub-modules; forward and
backward stay nn.GPT's and nn.TransformerBlock's):

    tensor_parallel    each block: heads over the tensor group (column-parallel qkv, row-parallel proj),
                       the MLP's hidden units over it (an MoE: each expert Megatron-split, router whole);
                       with sequence_parallel the regions between them on T'/t tokens per rank. Applied
                       whenever any of the three axes splits the blocks, t = 1 too (the split attention
                       whose core ring attention replaces: what the planner prices)
    context_parallel   ring attention over the context group on this rank's zigzag positions
    expert_parallel    each MoE layer: E/e experts per rank, tokens to their expert and back by all-to-all

The vocabulary rule: the embeddings, ln_f and the head stay whole on every rank, on every path (with or
without sequence parallelism, any tensor size). The tensor group's ranks compute the same logits and the
same loss; their gradients of those parameters are the same, nothing to sum over the tensor group.

Every transform marks what it leaves a partial sum (``Parameter.partial_over``): the data attachment sums
those before the data group's reduction. The units are ``nn.GPT.units`` — [embeddings, blocks, ln_f,
head] — with sequence parallelism SequenceScatter and SequenceGather around the blocks: what a pipeline
cuts into stages and one step runner steps through.
"""

from __future__ import annotations

import numpy as np

from minidist.nn import GPT, Module, MoE, Sequential

from ..context import context_parallel
from ..expert import expert_parallel
from ..tensor import tensor_parallel
from ..tensor.sequence import gather_sequence, sequence_shard


class SequenceScatter(Module):
    """(B, T', d) whole on every tensor rank -> this rank's (B, T'/t, d); backward all-gathers dy."""

    def __init__(self, comm):
        self.comm = comm

    def forward(self, x: np.ndarray) -> np.ndarray:
        return sequence_shard(x, self.comm.world_size, self.comm.rank)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        return gather_sequence(self.comm, dy)


class SequenceGather(Module):
    """This rank's (B, T'/t, d) -> (B, T', d) on every tensor rank; backward keeps this rank's piece of dy
    (every tensor rank computes the same dy from the same logits)."""

    def __init__(self, comm):
        self.comm = comm

    def forward(self, x: np.ndarray) -> np.ndarray:
        return gather_sequence(self.comm, x)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        return sequence_shard(dy, self.comm.world_size, self.comm.rank)


def split_for_mesh(model: GPT, mesh, seq_len: int, *, sequence_parallel: bool = False) -> Sequential:
    """``model`` (an nn.GPT or nn.SwitchTransformer, dropout 0, the same on every rank) split in place over
    the mesh's tensor, context and expert groups (module docstring); returns its units as a Sequential
    (the same Parameters). seq_len: the length T of the sequences the context axis cuts. Each split block
    prices itself (its ``flops``: 1/t of the whole block's when t divides the heads and d_ff). Every MoE
    routes a rank's micro-batch as one group (the Trainer checks the model's ``groups`` match)."""
    s = mesh.sizes
    if s["tensor"] > 1 or s["context"] > 1 or s["expert"] > 1:    # t = 1 too (module docstring)
        for block in model.blocks:
            tensor_parallel(block, mesh.group("tensor"), sequence_parallel=sequence_parallel)
    if s["context"] > 1:
        context_parallel(model, mesh.group("context"), seq_len=seq_len)
    for block in model.blocks:
        if isinstance(block.mlp, MoE):
            block.mlp.groups = 1                 # a rank's micro-batch is one routing group
    if s["expert"] > 1:
        expert_parallel(model, mesh.group("expert"))
    units = model.units()
    if sequence_parallel:
        group = mesh.group("tensor")
        units = [units[0], SequenceScatter(group), *units[1:-2], SequenceGather(group), *units[-2:]]
    model.already_split = True                   # a second parallelize of this model is refused
    return Sequential(*units)
