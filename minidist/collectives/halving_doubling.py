"""Recursive doubling and Rabenseifner's algorithm (recursive halving, then recursive doubling).

Both pair rank r with partner r XOR d for distances d that are powers of two, so they need a power-of-two
number of ranks P'. Any other P is folded first, as MPICH does: with P' the largest power of two <= P and
rem = P − P', each even rank r < 2·rem sends its array to r + 1 and sits out; the remaining P' ranks run
the algorithm under new numbers 0..P'−1; at the end each odd rank r < 2·rem sends the result back to r − 1.

Recursive doubling (short arrays): log2 P' steps; at each, partners swap their *whole* arrays and both
combine them, the lower rank's operand first, so that both compute the same bits (NaN signs, ±0 in max).

    T_rd = log2 P · (α + n β)                         bytes sent per rank: log2 P · n

Rabenseifner (long arrays; "Optimization of Collective Communication Operations in MPICH", Thakur,
Rabenseifner & Gropp, 2005). The array is cut into P' chunks; a block of d chunks is aligned to d.
  - reduce-scatter by recursive halving: at distance d = P'/2, P'/4, ..., 1, partners hold the same block
    of 2d chunks; each sends the partner's half and adds the partner's copy of its own half into it.
    Afterwards rank r holds the full reduction of chunk r (1/P' of the array), computed by r alone.
  - allgather by recursive doubling: at distance d = 1, 2, ..., P'/2 partners swap their blocks of d chunks.

    T_rab = 2 log2 P · α + 2 (P − 1)/P · n β          bytes sent per rank: 2 (P − 1)/P · n

Rabenseifner sends as few bytes as the ring with only 2 log2 P messages instead of 2(P − 1).
(cost: minidist.sim.collective_rounds "recursive_doubling", "rabenseifner", fold included, priced by
minidist.sim.collective_cost.)
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.common import TAGS, UFUNCS, largest_power_of_two
from minidist.collectives.pieces import split_offsets


def fold_in(comm, flat: np.ndarray, op: str, tag: int) -> int:
    """Non-power-of-two prologue: the even ranks below 2·rem hand their array to the odd rank above.

    flat: this rank's array, shape (n,); on the odd ranks below 2·rem it becomes op(own, the neighbour's).
    Returns this rank's number among the P' ranks that go on (-1: this rank sits out).
    """
    rem, r = comm.world_size - largest_power_of_two(comm.world_size), comm.rank
    if r >= 2 * rem:
        return r - rem
    if r % 2 == 0:
        comm.send(flat, dst=r + 1, tag=tag)
        return -1
    comm.recv(r - 1, tag=tag, out=flat, op=op)
    return r // 2


def fold_out(comm, flat: np.ndarray, tag: int) -> None:
    """Non-power-of-two epilogue: the odd ranks below 2·rem send the result, shape (n,), to r − 1."""
    rem, r = comm.world_size - largest_power_of_two(comm.world_size), comm.rank
    if r < 2 * rem:
        if r % 2:
            comm.send(flat, dst=r - 1, tag=tag)
        else:
            comm.recv(r + 1, tag=tag, out=flat)


def real_rank(comm, new_rank: int) -> int:
    """The rank of comm that runs under ``new_rank`` (0..P'−1) after fold_in."""
    rem = comm.world_size - largest_power_of_two(comm.world_size)
    return 2 * new_rank + 1 if new_rank < rem else new_rank + rem


def recursive_doubling_allreduce(comm, flat: np.ndarray, op: str = "sum") -> np.ndarray:
    """Allreduce ``flat`` by recursive doubling, in place.

    flat: this rank's contribution, shape (n,), contiguous; overwritten with the result. op: "sum",
    "max" or "min". Returns flat, shape (n,), bitwise the same on every rank.
    """
    tag, p2 = TAGS["recursive_doubling"], largest_power_of_two(comm.world_size)
    me = fold_in(comm, flat, op, tag)
    if me >= 0:
        mine, theirs = flat, np.empty_like(flat)
        distance = 1
        while distance < p2:  # swap whole arrays with the partner, then combine them
            partner = me ^ distance
            comm.sendrecv(mine, dst=real_rank(comm, partner), src=real_rank(comm, partner), sendtag=tag,
                          recvtag=tag, out=theirs)
            # Both partners run the very same operation: the lower rank's array first, the result written
            # over it. (a + b and b + a differ for NaNs of different signs, and NumPy's choice of NaN also
            # depends on which operand ``out`` is.)
            low, high = (theirs, mine) if partner < me else (mine, theirs)
            UFUNCS[op](low, high, out=low)
            mine, theirs = low, high
            distance <<= 1
        if mine is not flat:
            flat[...] = mine
    fold_out(comm, flat, tag)
    return flat


def rabenseifner_allreduce(comm, flat: np.ndarray, op: str = "sum") -> np.ndarray:
    """Allreduce ``flat`` by recursive halving + recursive doubling, in place.

    flat: this rank's contribution, shape (n,), contiguous; overwritten with the result. op: "sum",
    "max" or "min". Returns flat, shape (n,), bitwise the same on every rank.
    """
    tag, p2 = TAGS["rabenseifner"], largest_power_of_two(comm.world_size)
    me = fold_in(comm, flat, op, tag)
    if me >= 0:
        bounds = split_offsets(flat.size, p2)

        def block(rank: int, d: int) -> np.ndarray:
            """The aligned block of d chunks that holds chunk ``rank``."""
            first = rank // d * d
            return flat[bounds[first]:bounds[first + d]]

        def exchange(send: np.ndarray, out: np.ndarray, partner: int, op: str | None) -> None:
            peer = real_rank(comm, partner)
            comm.sendrecv(send, dst=peer, src=peer, sendtag=tag, recvtag=tag, out=out, op=op)

        distance = p2 // 2
        while distance >= 1:  # reduce-scatter: give the partner its half, add its copy of mine into mine
            exchange(block(me ^ distance, distance), block(me, distance), me ^ distance, op)
            distance //= 2
        distance = 1
        while distance < p2:  # allgather: swap the blocks of `distance` finished chunks
            exchange(block(me, distance), block(me ^ distance, distance), me ^ distance, None)
            distance <<= 1
    fold_out(comm, flat, tag)
    return flat
