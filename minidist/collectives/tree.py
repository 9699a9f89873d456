"""Tree allreduce: a binomial-tree reduce to rank 0, then a binomial-tree broadcast from rank 0.

Binomial tree on P ranks: rank r's parent is r with its lowest set bit cleared; its children are
r + 1, r + 2, r + 4, ... below its lowest set bit (and below P). For P = 8:

    reduce     step 1: 1→0 3→2 5→4 7→6    step 2: 2→0 6→4    step 3: 4→0
    broadcast  step 1: 0→4                step 2: 0→2 4→6    step 3: 0→1 2→3 4→5 6→7

Each step halves (reduce) or doubles (broadcast) the number of ranks holding data, so both take
⌈log2 P⌉ steps of a whole n-element message:

    T_tree = 2 ⌈log2 P⌉ (α + n β)       (exact when P is a power of two)

(cost: minidist.sim.collective_rounds "tree", priced by minidist.sim.collective_cost.)

Few messages (good for small, latency-bound arrays) but every message is the whole array (bad for large
ones): P − 1 messages of n elements in each phase, 2(P − 1)·n elements in total; the root sends
⌈log2 P⌉·n. The sum is computed once, at rank 0, and broadcast: every rank gets the same bits.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.common import TAGS


def tree_allreduce(comm, flat: np.ndarray, op: str = "sum") -> np.ndarray:
    """Allreduce ``flat`` with a binomial-tree reduce to rank 0 and a broadcast back, in place.

    flat: this rank's contribution, shape (n,), contiguous; overwritten with the result. op: "sum",
    "max" or "min". Returns flat, shape (n,), bitwise the same on every rank.
    """
    # BEGIN SOLUTION tree_allreduce
    p, r, tag = comm.world_size, comm.rank, TAGS["tree"]
    mask = 1
    while mask < p:  # reduce: add the children's partial sums, then hand ours to the parent
        if r & mask:
            comm.send(flat, dst=r - mask, tag=tag)
            break
        if r + mask < p:
            comm.recv(r + mask, tag=tag, out=flat, op=op)
        mask <<= 1
    mask = 1
    while mask < p:  # broadcast: receive the total from the parent ...
        if r & mask:
            comm.recv(r - mask, tag=tag, out=flat)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:  # ... and pass it on to the children, farthest first
        if r + mask < p:
            comm.send(flat, dst=r + mask, tag=tag)
        mask >>= 1
    return flat
    # END SOLUTION
