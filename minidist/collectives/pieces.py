"""One rule for cutting n items into P contiguous pieces, used everywhere in minidist.

The rule is ``np.array_split``'s: the first ``n mod P`` pieces hold one item more than the others.

    n = 10, P = 4   ->   sizes 3 3 2 2   ->   pieces [0, 3) [3, 6) [6, 8) [8, 10)

Collectives cut an array into chunks with it, data parallelism cuts a batch into shards, tensor
parallelism cuts features, spatial parallelism cuts rows, the pipeline cuts layers and micro-batches.
P may exceed n: the last P − n pieces are then empty (callers that cannot allow an empty piece say so).
"""

from __future__ import annotations

import numpy as np


def _check(n: int, parts: int) -> tuple[int, int]:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"split: n must be an integer >= 0, got {n!r}")
    if isinstance(parts, bool) or not isinstance(parts, (int, np.integer)) or parts < 1:
        raise ValueError(f"split: parts must be an integer >= 1, got {parts!r}")
    return int(n), int(parts)


def split_sizes(n: int, parts: int) -> list[int]:
    """Sizes of the ``parts`` pieces of range(n): [n//P + 1] * (n % P) + [n//P] * (P − n % P)."""
    n, parts = _check(n, parts)
    base, extra = divmod(n, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def split_offsets(n: int, parts: int) -> np.ndarray:
    """Offsets, shape (parts + 1,), int64: piece i is [offsets[i], offsets[i + 1])."""
    return np.concatenate([[0], np.cumsum(split_sizes(n, parts), dtype=np.int64)]).astype(np.int64)


def split_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """[(lo, hi), ...]: the half-open range of every piece.
    split_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]."""
    offsets = split_offsets(n, parts).tolist()
    return [(offsets[i], offsets[i + 1]) for i in range(len(offsets) - 1)]


def split_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """(lo, hi) of piece ``index`` alone, without building the others."""
    n, parts = _check(n, parts)
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < parts:
        raise ValueError(f"split: index must be an integer in [0, {parts}), got {index!r}")
    base, extra = divmod(n, parts)
    lo = int(index) * base + min(int(index), extra)
    return lo, lo + base + (1 if index < extra else 0)
