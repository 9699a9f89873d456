"""Bruck's allgather: every rank's block on every rank in ⌈log2 P⌉ rounds, for any P.

Bruck, Ho, Kipnis, Upfal & Weathersby, "Efficient Algorithms for All-to-All Communications in
Multiport Message-Passing Systems" (1997). Rank r keeps a list of blocks that starts with its own; in
round k it sends the first min(2^k, P − 2^k) blocks of its list to rank r − 2^k and appends what rank
r + 2^k sends it. After the rounds rank r holds the blocks of ranks r, r + 1, ..., r + P − 1 (mod P):
rotated by r into rank order.

    round k:  send list[:m] to r − 2^k;  list += recv from r + 2^k      m = min(2^k, P − 2^k)

Cost per rank (n bytes per block): ⌈log2 P⌉ messages, (P − 1)·n bytes — the bytes of the pairwise
allgather (primitives.allgather, P − 1 messages) in far fewer messages:

    time = ⌈log2 P⌉·α + (P − 1)·n·β
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.common import TAGS, agreement, check_array, check_comm, dtype_name


def bruck_allgather(comm, x: np.ndarray) -> list[np.ndarray]:
    """The list [x of rank 0, ..., x of rank P − 1] on every rank, in ⌈log2 P⌉ rounds.

    x: any shape, the same shape and dtype on every rank (blocks travel concatenated). Returns P new
    arrays of x's shape.
    """
    check_comm(comm)
    x = check_array(x)
    p, r, tag = comm.world_size, comm.rank, TAGS["bruck_allgather"]
    blocks = [x.copy()]                                   # blocks of ranks r, r + 1, ... in this order
    call = f"bruck_allgather(shape={x.shape}, dtype={dtype_name(x.dtype)})"
    with agreement(comm, call):
        distance = 1
        while distance < p:
            m = min(distance, p - distance)
            send = np.stack(blocks[:m])
            received = comm.sendrecv(send, dst=(r - distance) % p, src=(r + distance) % p, sendtag=tag,
                                     recvtag=tag, out=np.empty_like(send))
            blocks += list(received)
            distance *= 2
    return [blocks[(j - r) % p].copy() for j in range(p)]     # rotate: rank j's block sits at j − r


def bruck_allgather_time(world_size: int, nbytes: int, alpha: float, beta: float) -> float:
    """Closed form: ⌈log2 P⌉·α + (P − 1)·n·β (n: one block's bytes)."""
    rounds = (world_size - 1).bit_length()
    return rounds * alpha + (world_size - 1) * nbytes * beta
