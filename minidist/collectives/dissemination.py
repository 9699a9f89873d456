"""The dissemination barrier: nobody leaves until everybody has arrived, in ⌈log2 P⌉ rounds, any P.

Hensgen, Finkel & Manber, "Two Algorithms for Barrier Synchronization" (1988). In round k rank r tells
rank r + 2^k "I (and everyone I have heard from) arrived" and waits to hear the same from r − 2^k. After
round k rank r has heard, directly or through others, from the 2^(k+1) − 1 ranks before it; after
⌈log2 P⌉ rounds from all P − 1. Each message is empty: the barrier moves no data, only time.

    round k:  send () to r + 2^k;  recv from r − 2^k          time = ⌈log2 P⌉·α after the last arrival

The cluster's own ``comm.barrier()`` (cluster/group.py) uses this pattern with uncounted messages; this one
sends ordinary messages, so the ledger shows them: ⌈log2 P⌉ messages and 0 bytes per rank.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.common import TAGS, agreement, check_comm

TOKEN = np.empty(0, dtype=np.uint8)          # an empty message: the arrival is the information


def dissemination_barrier(comm) -> None:
    """Return only when every rank of comm has entered the barrier."""
    check_comm(comm)
    p, r, tag = comm.world_size, comm.rank, TAGS["dissemination_barrier"]
    with agreement(comm, "dissemination_barrier()"):
        distance = 1
        while distance < p:
            comm.sendrecv(TOKEN, dst=(r + distance) % p, src=(r - distance) % p, sendtag=tag, recvtag=tag,
                          out=np.empty(0, dtype=np.uint8))
            distance *= 2


def dissemination_rounds(world_size: int) -> int:
    """⌈log2 P⌉: the rounds (and messages per rank) of the barrier."""
    return (world_size - 1).bit_length()
