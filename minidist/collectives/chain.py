"""Pipelined (chain) broadcast: cut the array into S segments and pass them down a chain of ranks.

The "Hardware Accelerators for Training DNNs" tutorial's collectives chapter shows broadcast as a tree
(primitives.broadcast: ⌈log2 P⌉·(α + nβ), every step carrying all n bytes) and as a pipeline: root → root+1
→ ... → root+P−1, each rank forwarding a segment as soon as it has it, so the links work at once:

    segment j reaches the k-th rank of the chain at  (k + j)·(α + nβ/S)
    time = (P − 1 + S − 1)·(α + nβ/S)          messages per rank: S (the last rank: 0)

For large n the time tends to nβ — independent of P — at the best S = sqrt((P − 2)·nβ/α); for small n
the tree's log P steps win. Segments follow np.array_split along the first axis, so receivers need no
size message: each segment carries its own shape.
"""

from __future__ import annotations

import math

import numpy as np

from minidist.collectives.common import TAGS, agree, check_array, check_comm, check_root
from minidist.nn.checks import check_count, check_real


def chain_broadcast(comm, x: np.ndarray | None, root: int = 0, segments: int = 4) -> np.ndarray:
    """root's x on every rank, in `segments` pieces passed down the chain root, root + 1, ...

    x: at root the array (ndim ≥ 1); elsewhere ignored (None is fine). segments: S ≥ 1 (pieces along
    axis 0; more pieces than rows leaves some empty). Returns a new array of root's x's shape and dtype.
    """
    check_comm(comm)
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ValueError(f"chain_broadcast: segments must be an int >= 1, got {segments!r}")
    p, root, tag = comm.world_size, check_root(comm, root), TAGS["chain_broadcast"]
    agree(comm, f"chain_broadcast(root={root}, segments={segments})")
    position = (comm.rank - root) % p                    # my place in the chain: the root is 0
    following = (comm.rank + 1) % p if position < p - 1 else None
    if position == 0:
        data = check_array(x)
        if data.ndim == 0:
            raise ValueError("chain_broadcast needs x with at least one axis (segments cut axis 0)")
        pieces = np.array_split(data, segments)
    else:
        pieces = []
        for _ in range(segments):                         # receive a segment, pass it on, next
            pieces.append(comm.recv((comm.rank - 1) % p, tag=tag))
            if following is not None:
                comm.send(pieces[-1], following, tag=tag)
    if position == 0 and following is not None:
        for piece in pieces:
            comm.send(piece, following, tag=tag)
    return np.concatenate(pieces).copy()


def _check_costs(world_size: int, nbytes: int, alpha: float, beta: float) -> None:
    """P >= 1 ranks, n >= 0 bytes, α and β finite and >= 0 (else the formulas take roots of negative or
    NaN numbers), or the error naming the argument."""
    check_count(world_size, "world_size")
    check_count(nbytes, "nbytes", 0)
    check_real(alpha, "alpha", 0.0)
    check_real(beta, "beta", 0.0)


def chain_broadcast_time(world_size: int, nbytes: int, segments: int, alpha: float, beta: float) -> float:
    """Closed form for equal segments: (P − 1 + S − 1)·(α + nβ/S); 0 for one rank."""
    _check_costs(world_size, nbytes, alpha, beta)
    segments = check_count(segments, "segments")
    if world_size == 1:
        return 0.0
    return (world_size - 1 + segments - 1) * (alpha + nbytes * beta / segments)


def best_segments(world_size: int, nbytes: int, alpha: float, beta: float) -> int:
    """The S that minimises chain_broadcast_time: d/dS = 0 at S = sqrt((P − 2)·nβ/α), rounded, ≥ 1."""
    _check_costs(world_size, nbytes, alpha, beta)
    if world_size <= 2 or alpha == 0:
        return 1 if world_size <= 2 else max(1, nbytes)
    guess = math.sqrt((world_size - 2) * nbytes * beta / alpha)
    candidates = {max(1, math.floor(guess)), max(1, math.ceil(guess))}
    return min(candidates, key=lambda s: chain_broadcast_time(world_size, nbytes, s, alpha, beta))
