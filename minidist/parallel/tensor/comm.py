"""The communication tensor (intra-layer model) parallelism needs, and the shard arithmetic.

Built on ``minidist.collectives``' reduce_scatter and allgather (both rings). The all-reduce is composed
from those two rather than taken from ``collectives.allreduce``, whose ring is a student exercise:
the layers here must keep working in a student's copy.

Three small helpers on a Communicator ``comm`` of P ranks (the tensor-parallel group):

    allreduce_sum(comm, x)        every rank gets Σ_p x_p                  (ring: 2(P−1)/P·n words sent)
    allgather_features(comm, y_p) every rank gets [y_0 | y_1 | ... ]       (ring: (P−1)/P·n words sent)
    check_same_on_all_ranks(...)  a clear ValueError, on every rank, when the ranks disagree on a shape

and the shard arithmetic: ``shard_bounds(n, P)`` cuts n features into P contiguous pieces the way
``np.array_split`` does (the first n mod P pieces get one feature more), so widths not divisible by P work.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import allgather, reduce_scatter


def shard_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """[(lo, hi), ...] of the ``parts`` contiguous pieces of range(n), as np.array_split cuts them.

    Example: shard_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)].
    Every piece must hold at least one feature: a layer of 3 features cannot be split 4 ways.
    """
    n, parts = int(n), int(parts)
    if parts < 1:
        raise ValueError(f"need at least one shard, got {parts}")
    if n < parts:
        raise ValueError(f"cannot split {n} features into {parts} shards: each shard needs at least one "
                         f"feature (use at most {n} ranks for this layer)")
    base, extra = divmod(n, parts)
    sizes = [base + 1] * extra + [base] * (parts - extra)
    starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    return [(starts[i], starts[i + 1]) for i in range(parts)]


def shard_slice(n: int, parts: int, index: int) -> slice:
    """The slice of range(n) that shard ``index`` of ``parts`` owns."""
    if not 0 <= index < parts:
        raise ValueError(f"shard index {index} outside [0, {parts})")
    lo, hi = shard_bounds(n, parts)[index]
    return slice(lo, hi)


def allreduce_sum(comm, x: np.ndarray) -> np.ndarray:
    """Σ over the ranks of x (same shape on every rank), bitwise equal on every rank.

    Written as what a ring all-reduce is: a ring reduce-scatter (rank p ends with piece p of the sum,
    pieces as np.array_split(x.ravel(), P)) then a ring all-gather of the pieces. Each rank sends
    (P−1)/P·n words in each half, 2(P−1)/P·n in all; summed over the ranks exactly 2(P−1)·n for any n.
    Each piece is summed once, by its owner, and then only copied: every rank gets the same bits.
    """
    if comm.world_size == 1:
        return x.copy()
    my_piece = reduce_scatter(comm, x, op="sum")
    return np.concatenate(allgather(comm, my_piece)).reshape(x.shape)


def allgather_features(comm, y_part: np.ndarray) -> np.ndarray:
    """Concatenate every rank's (..., n_p) piece along the last axis, in rank order: (..., Σ n_p).

    Each rank sends its piece to the others: (P−1)/P·n words per rank when the pieces are equal.
    """
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
    """Raise ValueError on every rank unless every rank passes the same ``values``.

    Every rank takes part in the same all-gather and sees the same table, so all ranks raise
    together: no rank is left waiting in a collective the others have abandoned.
    """
    if comm.world_size == 1:
        return
    table = allgather(comm, np.asarray(values, dtype=np.int64))
    rows = [tuple(int(v) for v in row) for row in table]
    if any(row != rows[0] for row in rows):
        listing = ", ".join(f"rank {r}: {row}" for r, row in enumerate(rows))
        raise ValueError(f"{what} differs across the ranks of the tensor-parallel group ({listing}); "
                         f"every rank must build the same full layer and take its own slice")
