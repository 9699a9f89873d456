"""Recursive doubling and Rabenseifner's algorithm (recursive halving, then recursive doubling).

Both pair rank r with partner r XOR d for distances d that are powers of two, so they need a power-of-two
number of ranks P'. Any other P is folded first, as MPICH does: with P' the largest power of two <= P and
rem = P − P', each even rank r < 2·rem sends its array to r + 1 and sits out; the remaining P' ranks run
the algorithm under new numbers 0..P'−1; at the end each odd rank r < 2·rem sends the result back to r − 1.

Recursive doubling (short arrays): log2 P' steps; at each, partners swap their *whole* arrays and both add.

    T_rd = log2 P · (α + n β)                         bytes sent per rank: log2 P · n

Rabenseifner (long arrays; Thakur, Rabenseifner & Gropp 2005):
  - reduce-scatter by recursive halving: at distance P'/2, P'/4, ..., 1, partners split their current
    range of chunks in half, each sends the half the other keeps and adds the half it received. After
    log2 P' steps rank r holds the full sum of chunk r (1/P' of the array).
  - allgather by recursive doubling: at distance 1, 2, ..., P'/2 partners swap what they hold.

    T_rab = 2 log2 P · α + 2 (P − 1)/P · n β          bytes sent per rank: 2 (P − 1)/P · n

Rabenseifner sends as few bytes as the ring with only 2 log2 P messages instead of 2(P − 1).

Bitwise agreement: in recursive doubling both partners compute a + b from the same two arrays (IEEE
addition is commutative), so they agree after every step; in Rabenseifner each chunk is summed once, by
its owner, and then copied.

No working copy: given ``source=`` (``allreduce`` passes x), the first step reads this rank's values
from x and adds the partner's straight into the output (``recv(..., op=op, base=)``), as the ring does.
At P = 2 that halves the time of a 256 KiB recursive doubling (benchmarks/allreduce.md, "Session 4").
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.common import TAGS, UFUNCS, chunk_bounds, largest_power_of_two


def _fold_in(comm, flat: np.ndarray, op: str, tag: int,
             source: np.ndarray | None = None) -> tuple[int, np.ndarray]:
    """Non-power-of-two prologue. Returns this rank's number among the P' active ranks (-1 if idle) and
    the array that now holds its values: ``source`` (if given) until flat has been written, else flat.

    An odd rank below 2·rem receives its even neighbour's array into flat: flat = own + incoming.
    """
    p2 = largest_power_of_two(comm.world_size)
    rem, r = comm.world_size - p2, comm.rank
    mine = flat if source is None else source
    if r >= 2 * rem:
        return r - rem, mine
    if r % 2 == 0:
        comm.send(mine, dst=r + 1, tag=tag)
        return -1, mine
    comm.recv(r - 1, tag=tag, out=flat, op=op, base=mine)
    return r // 2, flat


def _fold_out(comm, flat: np.ndarray, tag: int) -> None:
    """Non-power-of-two epilogue: the odd ranks below 2·rem hand the result to the even ones."""
    rem, r = comm.world_size - largest_power_of_two(comm.world_size), comm.rank
    if r < 2 * rem:
        if r % 2:
            comm.send(flat, dst=r - 1, tag=tag)
        else:
            comm.recv(r + 1, tag=tag, out=flat)


def _real_rank(new_rank: int, rem: int) -> int:
    """Inverse of the fold's renumbering."""
    return 2 * new_rank + 1 if new_rank < rem else new_rank + rem


def recursive_doubling_allreduce(comm, flat: np.ndarray, op: str = "sum",
                                 source: np.ndarray | None = None) -> np.ndarray:
    """Allreduce the 1-D array ``flat`` (overwritten) by recursive doubling; returns it.

    source: this rank's array (1-D, like flat) if it is not already in ``flat``; it is never written,
    and flat's initial values are then never read. ``allreduce`` passes x itself: the first exchange
    adds x and the partner's array straight into flat (``out=flat, op=op, base=x``), so x needs no
    working copy and that step no separate addition. (A later step cannot do the same in place: a long
    message streams, and flat would change while it is still being sent.)
    """
    tag, p2 = TAGS["recursive_doubling"], largest_power_of_two(comm.world_size)
    rem = comm.world_size - p2
    me, mine = _fold_in(comm, flat, op, tag, source)     # mine: this rank's partial result so far
    if me >= 0:
        incoming, distance = None, 1
        while distance < p2:
            partner = _real_rank(me ^ distance, rem)
            if mine is flat:    # flat += the partner's partial result: a + b on one side, b + a on the other
                incoming = np.empty_like(flat) if incoming is None else incoming
                comm.sendrecv(flat, dst=partner, src=partner, sendtag=tag, recvtag=tag, out=incoming)
                UFUNCS[op](flat, incoming, out=flat)
            else:               # the first step, reading source: flat = source + the partner's array
                comm.sendrecv(mine, dst=partner, src=partner, sendtag=tag, recvtag=tag, out=flat, op=op,
                              base=mine)
                mine = flat
            distance <<= 1
        if mine is not flat:                      # no step at all (P = 1)
            flat[...] = mine
    _fold_out(comm, flat, tag)
    return flat


def rabenseifner_allreduce(comm, flat: np.ndarray, op: str = "sum",
                          source: np.ndarray | None = None) -> np.ndarray:
    """Allreduce the 1-D array ``flat`` (overwritten) by recursive halving + doubling; returns it.

    source: as for recursive doubling. The first halving sends half of source and adds the other half
    into flat (``base=``); every later step only touches chunks of flat that an earlier step wrote.
    """
    tag, p2 = TAGS["rabenseifner"], largest_power_of_two(comm.world_size)
    rem = comm.world_size - p2
    me, mine = _fold_in(comm, flat, op, tag, source)     # mine: this rank's partial sums so far
    if me >= 0:
        bounds = chunk_bounds(flat.size, p2)

        def chunks(lo: int, hi: int, of: np.ndarray = flat) -> np.ndarray:  # chunks lo..hi-1, one view
            return of[bounds[lo]:bounds[hi]]

        lo, hi, halvings = 0, p2, []
        distance = p2 // 2
        while distance >= 1:  # reduce-scatter by recursive halving
            partner = _real_rank(me ^ distance, rem)
            mid = (lo + hi) // 2
            keep, give = ((mid, hi), (lo, mid)) if me & distance else ((lo, mid), (mid, hi))
            comm.sendrecv(chunks(*give, of=mine), dst=partner, src=partner, sendtag=tag, recvtag=tag,
                          out=chunks(*keep), op=op, base=chunks(*keep, of=mine))
            mine = flat
            halvings.append((lo, hi))
            lo, hi = keep
            distance //= 2
        distance = 1
        while distance < p2:  # allgather by recursive doubling: undo the halvings in reverse
            partner = _real_rank(me ^ distance, rem)
            parent_lo, parent_hi = halvings.pop()
            theirs = (hi, parent_hi) if lo == parent_lo else (parent_lo, lo)
            comm.sendrecv(chunks(lo, hi), dst=partner, src=partner, sendtag=tag, recvtag=tag,
                          out=chunks(*theirs))
            lo, hi = parent_lo, parent_hi
            distance <<= 1
        if mine is not flat:                      # no step at all (P = 1)
            flat[...] = mine
    _fold_out(comm, flat, tag)
    return flat
