"""Van de Geijn's broadcast: scatter the array from the root, then allgather it around the ring.

Barnett, Payne, van de Geijn and Watts 1994 ("Broadcasting on meshes with wormhole routing"); in Chan et
al. 2007 ("Collective communication: theory, practice, and experience") as the long-vector broadcast
"scatter + bucket allgather"; the "Hardware Accelerators for Training DNNs" tutorial's table lists the
"Van de Geijn Algorithm" for large broadcasts. The binomial-tree broadcast (primitives.broadcast) sends
the whole array down each of ⌈log2 P⌉ levels: the root sends ⌈log2 P⌉·n. Cut into P chunks
(np.array_split) instead:

1. scatter: the root sends chunk j to rank j (P − 1 messages, (P − 1)/P · n elements);
2. allgather: ring.ring_allgather, the bucket algorithm (P − 1 steps, each rank passes a chunk right).

    root sends  2(P − 1) messages, 2 (P − 1)/P · n elements      the others  P − 1, (P − 1)/P · n
    T = 2(P − 1) α + 2 (P − 1)/P · n β      against the tree's  ⌈log2 P⌉ (α + n β)

so for large n it takes about 2nβ whatever P, the tree log P · nβ (from P = 4 on it wins). The steps are
described in minidist.sim.collective_rounds ("van_de_geijn") and priced there exactly.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.common import TAGS, agree, check_array, check_comm, check_root, dtype_name
from minidist.collectives.ring import ring_allgather, ring_chunk


def van_de_geijn_broadcast(comm, x: np.ndarray, root: int = 0) -> np.ndarray:
    """root's x on every rank, by a scatter from the root and a ring allgather.

    x: on every rank an array of the root's shape and dtype (only the root's values matter: the others'
    arrays say how many elements to expect, as MPI_Bcast's buffer does). Returns a new array of x's shape
    and dtype, equal to the root's x on every rank; x is not modified.
    """
    check_comm(comm)
    x = check_array(x)
    p, root, tag = comm.world_size, check_root(comm, root), TAGS["van_de_geijn_broadcast"]
    agree(comm, f"van_de_geijn_broadcast(root={root}, shape={x.shape}, dtype={dtype_name(x.dtype)})")
    flat = np.array(x, copy=True, order="C").reshape(-1)
    if p == 1:
        return flat.reshape(x.shape)
    if comm.rank == root:                         # scatter: chunk j to rank j
        for dst in range(p):
            if dst != root:
                comm.send(ring_chunk(flat, p, dst), dst=dst, tag=tag)
    else:
        comm.recv(root, tag=tag, out=ring_chunk(flat, p, comm.rank))
    return ring_allgather(comm, flat).reshape(x.shape)
