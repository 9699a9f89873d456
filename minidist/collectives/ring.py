"""Ring allreduce: a reduce-scatter around the ring, then an allgather around the ring.

The P ranks sit on a ring; rank r only ever sends to r + 1 and receives from r − 1 (mod P). The array
(n elements) is cut into P chunks (np.array_split's rule, minidist.collectives.pieces).

1. Reduce-scatter, P − 1 steps. At step s rank r sends chunk (r − s − 1) mod P to its right neighbour and
   receives chunk (r − s − 2) mod P from its left neighbour, adding it into its own copy. A chunk picks up
   one more rank's contribution at every hop, so after P − 1 hops chunk r, at rank r, is the full sum.
2. Allgather, P − 1 steps. At step s rank r sends chunk (r − s) mod P (the finished one it has) and
   receives chunk (r − s − 1) mod P, overwriting its copy. Every finished chunk travels once around.

Cost ("Scaling Deep Learning" slides — ring allreduce; "Scaling Up Training" slides — O(n) per node,
independent of p): 2(P − 1) messages per rank of about n/P elements, 2(P − 1)/P · n elements sent per
rank, and under the α-β model

    T_ring = 2(P − 1) α + 2 (P − 1)/P · n β        (n in bytes)

— the bandwidth term hardly grows with P, which is why rings are used for large gradients. These steps
are described once, as data, in minidist.sim.collective_rounds ("ring"); minidist.sim.collective_cost
prices them exactly (any n) and holds the formula above (``allreduce_cost``).

Each chunk's final value is computed once, by its owner, and then only copied: every rank ends with
bitwise the same array. The additions happen on receipt, straight out of the sender's message
(``sendrecv(..., out=chunk, op=op)``), so no temporary buffer is needed.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.common import TAGS
from minidist.collectives.pieces import split_range


def ring_allreduce(comm, flat: np.ndarray, op: str = "sum") -> np.ndarray:
    """Allreduce ``flat`` around the ring, in place: ``ring_reduce_scatter``, then ``ring_allgather``.

    flat: this rank's contribution, shape (n,), contiguous; overwritten with the result.
    op: "sum", "max" or "min" (``allreduce`` turns "mean" into "sum" and divides afterwards).
    Returns flat, shape (n,): the elementwise reduction over all ranks, bitwise the same on every rank.
    """
    ring_reduce_scatter(comm, flat, op)
    return ring_allgather(comm, flat)


def ring_chunk(flat: np.ndarray, p: int, i: int) -> np.ndarray:
    """Chunk i mod P of flat (a view): np.array_split's rule, minidist.collectives.pieces.split_range
    (integer arithmetic: a ring step of a small bucket must not pay for an offsets array)."""
    lo, hi = split_range(flat.size, p, i % p)
    return flat[lo:hi]


def ring_reduce_scatter(comm, flat: np.ndarray, op: str = "sum") -> np.ndarray:
    """Phase 1, in place: P − 1 steps; at step s rank r sends chunk (r − s − 1) mod P to r + 1 and adds
    chunk (r − s − 2) mod P from r − 1 into its own. Afterwards ``ring_chunk(flat, P, r)`` is the full
    reduction on rank r (the other chunks hold partial ones). flat: shape (n,). Returns flat."""
    # BEGIN SOLUTION ring_allreduce
    # BEGIN PROMPT
    # Hint: in each of the P − 1 steps call comm.sendrecv(my_chunk, dst=right, src=left,
    # sendtag=TAGS["ring"], recvtag=TAGS["ring"], out=their_chunk, op=op) — op= adds the incoming chunk
    # into out; ring_chunk(flat, p, i) is chunk i mod P.
    # END PROMPT
    p, r, tag = comm.world_size, comm.rank, TAGS["ring"]
    for s in range(p - 1):  # send my chunk right, receive from the left, add it in
        comm.sendrecv(ring_chunk(flat, p, r - s - 1), dst=(r + 1) % p, src=(r - 1) % p, sendtag=tag,
                      recvtag=tag, out=ring_chunk(flat, p, r - s - 2), op=op)
    return flat
    # END SOLUTION


def ring_allgather(comm, flat: np.ndarray) -> np.ndarray:
    """Phase 2, in place: P − 1 steps; at step s rank r sends chunk (r − s) mod P (finished) to r + 1 and
    overwrites chunk (r − s − 1) mod P with what comes from r − 1. Needs chunk r finished on rank r;
    afterwards every chunk is. flat: shape (n,). Returns flat."""
    # BEGIN SOLUTION ring_allreduce
    # BEGIN PROMPT
    # Hint: as ring_reduce_scatter, one chunk further on, and without op= (overwrite, do not add).
    # END PROMPT
    p, r, tag = comm.world_size, comm.rank, TAGS["ring"]
    for s in range(p - 1):  # pass the finished chunks once around the ring
        comm.sendrecv(ring_chunk(flat, p, r - s), dst=(r + 1) % p, src=(r - 1) % p, sendtag=tag,
                      recvtag=tag, out=ring_chunk(flat, p, r - s - 1))
    return flat
    # END SOLUTION
