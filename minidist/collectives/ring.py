"""Ring allreduce: a reduce-scatter around the ring, then an allgather around the ring.

The P ranks sit on a ring; rank r only ever sends to r + 1 and receives from r − 1 (mod P). The array
(n elements) is cut into P chunks (np.array_split).

1. Reduce-scatter, P − 1 steps. At step s rank r sends chunk (r − s − 1) mod P to its right neighbour and
   receives chunk (r − s − 2) mod P from its left neighbour, adding it into its own copy. A chunk picks up
   one more rank's contribution at every hop, so after P − 1 hops chunk r, at rank r, is the full sum.
2. Allgather, P − 1 steps. At step s rank r sends chunk (r − s) mod P (the finished one it has) and
   receives chunk (r − s − 1) mod P, overwriting its copy. Every finished chunk travels once around.

Cost (seeds: "Scaling Deep Learning" — ring allreduce; "Scaling Up Training" — O(n) per node,
independent of p): 2(P − 1) messages per rank of n/P elements each, so each rank sends
2(P − 1)/P · n elements, and under the α-β model

    T_ring = 2(P − 1) α + 2 (P − 1)/P · n β        (n in bytes)

— the bandwidth term hardly grows with P, which is why rings are used for large gradients.

Every chunk's final value is computed once, by its owner, and then only copied: all ranks end with
bitwise the same array. The reductions go straight out of the sender's shared-memory message
(``recv(..., out=chunk, op="sum")``): no temporary buffer. And no working copy of the input either:
every chunk is first written by a reduce-scatter receive (own values + incoming, ``base=``) or an
allgather receive, so the ring can read this rank's values from x itself (``source=``). At P = 4 on
two cores that copy was 30% of a 32 MiB allreduce (benchmarks/allreduce.md).
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.common import TAGS, chunk_bounds


def ring_allreduce(comm, flat: np.ndarray, op: str = "sum", source: np.ndarray | None = None) -> np.ndarray:
    """Allreduce the 1-D array ``flat`` (n elements, overwritten) around the ring; returns it.

    op is "sum", "max" or "min" (the caller turns "mean" into "sum" then divides).
    source: this rank's contribution (1-D, like flat), if it is not already in ``flat``; then flat's
    initial values are never read, so it may be uninitialised (``allreduce`` passes x itself here and
    saves copying it into the working buffer). Every reduce-scatter receive combines the incoming chunk
    with this rank's own values of that chunk: ``recv(..., out=chunk, op=op, base=own chunk)``.
    """
    # BEGIN SOLUTION ring_allreduce
    p, r = comm.world_size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    bounds = chunk_bounds(flat.size, p)
    own = flat if source is None else source   # this rank's contribution

    def chunk(i: int, of: np.ndarray = flat) -> np.ndarray:
        i %= p
        return of[bounds[i]:bounds[i + 1]]

    for s in range(p - 1):  # reduce-scatter: after this, chunk r is complete on rank r
        # step 0 sends an own chunk, later steps pass on the partial sum received the step before;
        # each chunk received here is touched for the first time: partial sum = own + incoming
        comm.sendrecv(chunk(r - s - 1, flat if s else own), dst=right, src=left, sendtag=TAGS["ring"],
                      recvtag=TAGS["ring"], out=chunk(r - s - 2), op=op, base=chunk(r - s - 2, own))
    for s in range(p - 1):  # allgather: pass the finished chunks once around the ring
        comm.sendrecv(chunk(r - s), dst=right, src=left, sendtag=TAGS["ring"], recvtag=TAGS["ring"],
                      out=chunk(r - s - 1))
    if p == 1 and source is not None:          # no step at all: the result is this rank's own array
        flat[...] = source
    return flat
    # END SOLUTION
