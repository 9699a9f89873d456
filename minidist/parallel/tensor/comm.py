"""The communication of tensor (intra-layer model) parallelism: Megatron's f and g, and the shards.

Megatron-LM (Shoeybi et al. 2019) makes the communication of a split layer explicit with two conjugate
operators on the P ranks of the tensor-parallel group:

    f: forward identity,   backward all-reduce      (in front of a column-parallel layer)
    g: forward all-reduce, backward identity        (behind a row-parallel layer)

Features are cut into P contiguous shards by ``collectives.pieces`` (np.array_split's rule:
the first n mod P shards hold one feature more); here every shard must hold at least one feature.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import allgather, pairwise_allreduce
from minidist.collectives.pieces import split_bounds, split_range
from minidist.nn import Module, Parameter
from minidist.nn.checks import is_count


def feature_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """[(lo, hi), ...] of the ``parts`` feature shards of range(n), none empty (3 features cannot be split 4
    ways: ValueError). Example: feature_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]."""
    _check_not_empty(n, parts)
    return split_bounds(int(n), int(parts))


def feature_slice(n: int, parts: int, index: int) -> slice:
    """The slice of range(n) that shard ``index`` of ``parts`` owns (no shard empty)."""
    if not 0 <= index < parts:
        raise ValueError(f"shard index {index} outside [0, {parts})")
    _check_not_empty(n, parts)
    return slice(*split_range(int(n), int(parts), int(index)))


def _check_not_empty(n: int, parts: int) -> None:
    if not is_count(parts):
        raise ValueError(f"need at least one shard (an integer >= 1), got {parts!r}")
    if int(n) < int(parts):
        raise ValueError(f"cannot split {n} features into {parts} shards: each shard needs at least one "
                         f"feature (use at most {n} ranks for this layer)")


def shard_parameter(source: Parameter, index=...) -> Parameter:
    """A new Parameter, a copy of ``source.data[index]`` (a rank's shard; ``...``: all of it), under its name
    and partial over the same groups (a split made after another keeps the first one's sums)."""
    shard = Parameter(source.data[index].copy(), name=source.name)
    shard.partial_over = list(source.partial_over)
    return shard


def group_allreduce(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """x reduced elementwise over the group's ranks, bitwise the same on every rank: reduce-scatter then
    all-gather (collectives.pairwise_allreduce: the ring's bytes without the ring, lesson 05's exercise, so
    these layers keep working in a student's copy), 2(P−1)/P·n words per rank. One rank: a copy."""
    return pairwise_allreduce(comm, x, op=op) if comm.world_size > 1 else x.copy()


def allgather_features(comm, y_part: np.ndarray) -> np.ndarray:
    """Concatenate every rank's (..., n_p) piece along the last axis, in rank order: (..., Σ n_p).
    Each rank sends its piece to the others: (P−1)/P·n words per rank when the pieces are equal."""
    if comm.world_size == 1:
        return y_part.copy()
    parts = allgather(comm, y_part)
    leading = {part.shape[:-1] for part in parts}
    if len(leading) > 1:  # every rank sees the same table, so every rank raises
        shapes = ", ".join(f"rank {r}: {part.shape}" for r, part in enumerate(parts))
        raise ValueError(f"the ranks of a tensor-parallel group must all see the same batch; their output "
                         f"slices have shapes {shapes}")
    return np.concatenate(parts, axis=-1)


def check_same_on_all_ranks(comm, what: str, values: tuple[int, ...]) -> None:
    """Raise ValueError on every rank unless every rank passes the same ``values``: all take part in one
    all-gather and see the same table, so they raise together (none is left waiting in a collective)."""
    if comm.world_size == 1:
        return
    table = allgather(comm, np.asarray(values, dtype=np.int64))
    rows = [tuple(int(v) for v in row) for row in table]
    if any(row != rows[0] for row in rows):
        listing = ", ".join(f"rank {r}: {row}" for r, row in enumerate(rows))
        raise ValueError(f"{what} differs across the ranks of the tensor-parallel group ({listing}); "
                         f"every rank must build the same full layer and take its own slice")


class CopyToTensorParallel(Module):
    """Megatron's f: forward is the identity (every rank already holds x); backward all-reduces dx."""

    def __init__(self, comm):
        self.comm = comm

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: the whole input, shape (..., d), the same on every rank. Returns x itself."""
        return x

    def backward(self, dx_partial: np.ndarray) -> np.ndarray:
        """dx_partial: this rank's term of dx, shape (..., d). Returns dx = Σ_p dx_partial_p, (..., d)."""
        return group_allreduce(self.comm, dx_partial)


class ReduceFromTensorParallel(Module):
    """Megatron's g: forward all-reduces the partial outputs; backward is the identity."""

    def __init__(self, comm):
        self.comm = comm

    def forward(self, z_partial: np.ndarray) -> np.ndarray:
        """z_partial: this rank's partial product (..., out). Returns z = Σ_p z_partial_p, (..., out)."""
        return group_allreduce(self.comm, z_partial)

    def backward(self, dz: np.ndarray) -> np.ndarray:
        """dz: upstream gradient, shape (..., out), whole on every rank. Returns dz itself."""
        return dz

