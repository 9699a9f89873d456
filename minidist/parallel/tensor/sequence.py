"""Sequence parallelism: the regions outside the tensor-parallel layers run on T/t tokens per rank.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022). In tensor
parallelism alone every rank runs the LayerNorms, residual adds and dropouts on the whole (B, T, d)
activation and keeps all of it for backward. Split those regions along the sequence instead: rank p holds
tokens [p·T/t, (p+1)·T/t). Megatron's f and g (comm.py) become

    ḡ: forward all-gather along T, backward reduce-scatter      (in front of a tensor-parallel region)
    r̄: forward reduce-scatter along T, backward all-gather      (behind it, instead of g's all-reduce)

An all-reduce is a reduce-scatter followed by an all-gather, so with n = B·T·d words each rank sends
(t−1)/t·n in each operator: 2(t−1)/t·n per sub-layer forward and the same backward — the same bytes as
tensor parallelism alone. What falls by t is the activation memory of the regions between them.

The pieces are whole tokens, so t must divide T (a ValueError otherwise): the ring's reduce-scatter cuts
a (T, B, d) array into t equal runs of tokens (np.array_split's rule on T·B·d words).
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import allgather, reduce_scatter
from minidist.nn import Module
from minidist.nn.checks import check_count, check_rank

from .comm import CopyToTensorParallel, ReduceFromTensorParallel


def check_sequence_split(seq_len: int, parts: int) -> None:
    """Raise ValueError unless ``parts`` divides ``seq_len`` (sequence parallelism cuts whole tokens)."""
    if seq_len % parts:
        raise ValueError(f"sequence parallelism over {parts} ranks needs a sequence length divisible by "
                         f"{parts}, got T = {seq_len} (pad the sequence or use tensor parallelism alone)")


def sequence_shard(x: np.ndarray, parts: int, rank: int) -> np.ndarray:
    """Rank's tokens of x (B, T, ...): x[:, rank·T/t : (rank+1)·T/t], a copy."""
    check_rank(rank, check_count(parts, "sequence_shard parts"), "sequence_shard rank")
    check_sequence_split(x.shape[1], parts)
    n = x.shape[1] // parts
    return x[:, rank * n:(rank + 1) * n].copy()


def gather_sequence(comm, x_part: np.ndarray) -> np.ndarray:
    """(B, T/t, d) on every rank → (B, T, d), the pieces in rank order. (t−1)/t·n words sent per rank."""
    if comm.world_size == 1:
        return x_part.copy()
    return np.concatenate(allgather(comm, x_part), axis=1)


def reduce_scatter_sequence(comm, x: np.ndarray) -> np.ndarray:
    """(B, T, d) partial sums on every rank → (B, T/t, d): this rank's tokens of Σ_p x_p."""
    batch, seq_len = x.shape[:2]
    check_sequence_split(seq_len, comm.world_size)
    if comm.world_size == 1:
        return x.copy()
    tokens_first = np.ascontiguousarray(np.swapaxes(x, 0, 1))        # (T, B, d): a piece is whole tokens
    piece = reduce_scatter(comm, tokens_first, op="sum")
    return np.swapaxes(piece.reshape(seq_len // comm.world_size, batch, *x.shape[2:]), 0, 1).copy()


class GatherFromSequenceParallel(Module):
    """ḡ: forward all-gathers the tokens (B, T/t, d) → (B, T, d); backward reduce-scatters the gradient."""

    def __init__(self, comm):
        self.comm = comm

    def forward(self, x_part: np.ndarray) -> np.ndarray:
        return gather_sequence(self.comm, x_part)

    def backward(self, dx_partial: np.ndarray) -> np.ndarray:
        return reduce_scatter_sequence(self.comm, dx_partial)


class ReduceScatterToSequenceParallel(Module):
    """r̄: forward reduce-scatters the partial outputs (B, T, d) → (B, T/t, d); backward all-gathers."""

    def __init__(self, comm):
        self.comm = comm

    def forward(self, z_partial: np.ndarray) -> np.ndarray:
        return reduce_scatter_sequence(self.comm, z_partial)

    def backward(self, dz_part: np.ndarray) -> np.ndarray:
        return gather_sequence(self.comm, dz_part)


def region_operators(comm, sequence_parallel: bool) -> tuple[Module, Module]:
    """The operators in front of and behind a tensor-parallel region: (f, g), or (ḡ, r̄) with sequence
    parallelism."""
    if sequence_parallel:
        return GatherFromSequenceParallel(comm), ReduceScatterToSequenceParallel(comm)
    return CopyToTensorParallel(comm), ReduceFromTensorParallel(comm)


class SequenceShard:
    """A split GPT's ``position_ids`` under sequence parallelism: of the positions ``inner(T)`` of its T
    tokens, the T/t that reach its first block (the embedding's reduce-scatter keeps chunk ``rank``)."""

    def __init__(self, comm, inner):
        self.comm, self.inner = comm, inner

    def __call__(self, t: int) -> np.ndarray:
        check_sequence_split(t, self.comm.world_size)
        n = t // self.comm.world_size
        return self.inner(t)[self.comm.rank * n:(self.comm.rank + 1) * n]
