"""Which tokens of a sequence each of the c context-parallel ranks holds: the naive and the zigzag split.

naive    rank i holds the i-th of c contiguous pieces of range(T).
zigzag   cut range(T) into 2c pieces; rank i holds piece i and piece 2c−1−i.

With a causal mask a query at position p attends to p+1 keys, so the naive split gives the last rank
about 2c−1 times the work of the first: with L = T/c tokens each, rank i has i·L² + L(L+1)/2 unmasked
query–key pairs. The zigzag pairs an early piece with a late one: with L = T/(2c), rank i has
(iL² + L(L+1)/2) + ((2c−1−i)L² + L(L+1)/2) = T(T+1)/(2c) pairs — exactly 1/c of the T(T+1)/2 in all,
whenever 2c divides T (the load-balanced split of Megatron-LM's context parallelism). Pieces follow
collectives.pieces's rule, so T need not divide evenly; every piece must hold at least one token (T ≥ c
for naive, T ≥ 2c for zigzag).
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.pieces import split_bounds
from minidist.nn.checks import check_count, check_rank

LAYOUTS = ("naive", "zigzag")


def positions(seq_len: int, parts: int, rank: int, layout: str = "zigzag") -> np.ndarray:
    """The global positions (sorted int64 array) of the tokens rank ``rank`` of ``parts`` holds."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    check_count(seq_len, "seq_len"), check_rank(rank, check_count(parts, "parts"))
    pieces = parts if layout == "naive" else 2 * parts
    if seq_len < pieces:
        raise ValueError(f"the {layout} split of a sequence over {parts} ranks cuts it into {pieces} pieces "
                         f"of at least one token each; got a sequence of {seq_len} tokens (need >= {pieces})")
    bounds = split_bounds(int(seq_len), pieces)
    held = [rank] if layout == "naive" else [rank, 2 * parts - 1 - rank]
    return np.concatenate([np.arange(*bounds[i]) for i in held]).astype(np.int64)


def shard(x: np.ndarray, parts: int, rank: int, layout: str = "zigzag", axis: int = -2) -> np.ndarray:
    """This rank's tokens of x along ``axis`` (default −2: the T of (B, h, T, d_k)), a copy."""
    return np.take(x, positions(x.shape[axis], parts, rank, layout), axis=axis)


def unshard(pieces: list[np.ndarray], layout: str = "zigzag", axis: int = -2) -> np.ndarray:
    """Put every rank's piece (in rank order) back in sequence order along ``axis``."""
    parts = len(pieces)
    seq_len = sum(p.shape[axis] for p in pieces)
    order = np.concatenate([positions(seq_len, parts, r, layout) for r in range(parts)])
    whole = np.concatenate(pieces, axis=axis)
    return np.take(whole, np.argsort(order), axis=axis)
