"""Allreduce through the cluster's shared area: every rank reduces out of every peer's array in place.

When the ranks share memory, messages are not needed: rank r copies its input into its own array in
the shared area (``comm.shared_area()``, cluster/shared_area.py), and after a meeting every rank can
read every array in place. Then, for an array of n elements:

- small (up to ``WHOLE_BYTES``): every rank adds the P arrays itself, *in rank order*
  (x0 + x1 + ... + x(P−1)) — naive's work, one meeting and nothing else;
- larger: 1. reduce-scatter: rank r adds piece r (np.array_split's rule) of the P arrays, in rank
  order, and writes the sum over piece r of its own array; 2. after a second meeting, allgather:
  rank r copies every other piece q out of rank q's array.

Either way every element is the same operations in the same order on every rank (or computed once and
copied): every rank ends with the same bits, those of the sum in rank order. One or two meetings
instead of the ring's 2(P − 1) message steps, and no mailbox copy.

On the simulated clock each piece read is charged as a message (shared_area.py): small arrays as
naive's exchange, (P − 1)(α + n β); larger ones P − 1 pieces of about n/P in and out per phase,
2(P − 1)(α + n/P β), the ring's cost. On a real machine (the cost model of ``choose_algorithm``, with
the constants of benchmarks/allreduce.md), per rank, for the larger arrays

    T_shared = 2 t_meet + (2n + n/P) / B        (copy in, read P pieces, write one; read P − 1 pieces)
    T_ring   = 2(P − 1) t_step + 4 (P − 1)/P · n / B       (every chunk in and out of a mailbox)

(small arrays: one t_meet and (1 + P) n / B), with B one core's copy bandwidth (bytes read + written
per second): a meeting costs a few microseconds against a message step's tens, so the shared area wins
up to a few MiB; it is used up to its size (``run``'s block reserves 1 MiB per rank, layout.py). Where
there is no area (a sub-communicator, the MPI backend, a Topology) or the array does not fit,
``shared_memory_allreduce`` runs the ring instead.
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np

from minidist.cluster.topology import topology_of
from minidist.collectives.common import UFUNCS
from minidist.collectives.ring import ring_allreduce
from minidist.split import split_sizes

# Measured on a 2-core VM, P = 2, ranks on their own cores (benchmarks/allreduce.md, issue 43's section)
MEETING_SECONDS = 2e-6        # one meeting (1.0-1.4 us when both ranks spin)
STEP_SECONDS = 32e-6          # one message step of the ring at 1 MiB, beyond its bytes
COPY_BYTES_PER_SECOND = 55e9  # one core copying 32 MiB (bytes read + written; 53-59 GB/s)
WHOLE_BYTES = 16 * 1024       # arrays up to this size: every rank reduces all of it (one meeting)


def shared_area_bytes(comm) -> int:
    """The largest array (bytes) ``shared_memory_allreduce`` reduces in the shared area of ``comm``;
    0 where it has none (a sub-communicator, the MPI backend, a communicator of another kind) or where
    the run models ranks on several machines (``run(..., link=Topology(...))``: no memory in common)."""
    area = comm.shared_area() if hasattr(comm, "shared_area") else None
    return 0 if area is None or topology_of(comm) is not None else area.capacity


def shared_memory_time(nbytes: int, world_size: int) -> float:
    """Seconds of a shared-area allreduce of ``nbytes`` on one machine (the model above)."""
    if nbytes <= WHOLE_BYTES:
        return MEETING_SECONDS + (1 + world_size) * nbytes / COPY_BYTES_PER_SECOND
    return 2 * MEETING_SECONDS + (2 + 1 / world_size) * nbytes / COPY_BYTES_PER_SECOND


def ring_time(nbytes: int, world_size: int) -> float:
    """Seconds of the ring allreduce of ``nbytes`` through the mailboxes of one machine (the model above)."""
    p = world_size
    return 2 * (p - 1) * STEP_SECONDS + 4 * (p - 1) / p * nbytes / COPY_BYTES_PER_SECOND


def shared_memory_allreduce(comm, flat: np.ndarray, op: str = "sum") -> np.ndarray:
    """Allreduce ``flat`` (shape (n,), contiguous) in place through the shared area; returns flat.

    op: "sum", "max" or "min". The result is the reduction in rank order, bitwise the same on every
    rank. Without an area that holds flat, the ring (ring.py) does it.
    """
    if comm.world_size == 1:
        return flat
    room = shared_area_bytes(comm)
    if room == 0 or flat.nbytes > room:
        return ring_allreduce(comm, flat, op)
    p, r, ufunc, area = comm.world_size, comm.rank, UFUNCS[op], comm.shared_area()
    arrays = area.arrays(flat.dtype, flat.size)
    arrays[r][...] = flat
    if flat.nbytes <= WHOLE_BYTES:                      # every rank reduces all of it: one meeting
        area.meet(sent=[flat.nbytes] * p, received=[flat.nbytes] * p)
        return reduce_in_rank_order(ufunc, arrays, slice(None), flat)
    sizes = split_sizes(flat.size, p)           # np.array_split's rule (minidist.split), plain ints
    bounds = [0, *accumulate(sizes)]
    pieces = [slice(bounds[q], bounds[q + 1]) for q in range(p)]
    piece_bytes = [size * flat.itemsize for size in sizes]
    area.meet(sent=piece_bytes, received=[piece_bytes[r]] * p)      # every input is in the area
    mine = pieces[r]
    arrays[r][mine] = reduce_in_rank_order(ufunc, arrays, mine, flat[mine])
    area.meet(sent=[piece_bytes[r]] * p, received=piece_bytes)      # every piece is reduced
    for q in range(p):
        if q != r:
            flat[pieces[q]] = arrays[q][pieces[q]]
    return flat


def reduce_in_rank_order(ufunc, arrays: list[np.ndarray], piece: slice, out: np.ndarray) -> np.ndarray:
    """out = ((arrays[0][piece] ∘ arrays[1][piece]) ∘ arrays[2][piece]) ∘ ... (∘: ufunc); returns out.

    A fixed order, so every rank that computes it gets the same bits. out: P >= 2 arrays' piece shape.
    """
    ufunc(arrays[0][piece], arrays[1][piece], out=out)
    for other in arrays[2:]:
        ufunc(out, other[piece], out=out)
    return out
