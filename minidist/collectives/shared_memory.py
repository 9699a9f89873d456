"""Allreduce through the cluster's shared memory: every rank reduces out of every peer's array in place.

When the ranks share memory, messages are not needed. Each rank *exposes* an array that every other
rank can read and write, and a meeting (cluster/shared_area.py) says that all are there. For an array
of n elements:

- small (up to ``WHOLE_BYTES``): each rank copies it into its array in the shared area, and after one
  meeting every rank adds the P arrays itself, *in rank order* (x0 + x1 + ... + x(P−1)): naive's work;
- larger: the P exposed arrays form a window (cluster/window.py, MPI's one-sided get and put). Rank r
  adds piece r (np.array_split's rule) of the P arrays in rank order, a chunk at a time, writes the sum
  into its own result and *puts* it into every other exposed array while the chunk is still in its
  cache; after a second meeting every piece is everywhere.

What a rank exposes: its array itself if it lies in the shared block (``shared_empty``: the peers then
get and put through views, with no copy at all), or if the array is larger than the area and processes
may copy between each other (``has_windows``: the kernel copies the chunks, process_vm_readv/writev);
otherwise a copy in the area, from which it copies the other pieces out at the end. So without
cross-memory copies (``MINIDIST_CROSS_MEMORY=0``, macOS) every array the area holds still goes through it,
each peer's exposed array a view of the block. Every element is
computed once, by one rank, in the same order, and only copied: every rank ends with the same bits,
those of the sum in rank order. Two meetings instead of the ring's 2(P − 1) message steps, no mailbox.

On the simulated clock each piece read or written is charged as a message (shared_area.py): small
arrays as naive's exchange, (P − 1)(α + n β); larger ones P − 1 pieces of about n/P in and out per
phase, 2(P − 1)(α + n/P β), the ring's cost. On a real machine (the cost model of ``choose_algorithm``,
with the constants of benchmarks/allreduce.md), per rank, for arrays that the area holds

    T_shared = 2 t_meet + (2n + n/P) / B                (about: copy in, read P pieces, write one)
    T_ring   = 2(P − 1) t_step + 4 (P − 1)/P · n / B    (every chunk in and out of a mailbox)

(small arrays: one t_meet and (1 + P) n / B), with B one core's copy bandwidth (bytes read + written
per second): a meeting costs a few microseconds against a message step's tens, so the shared area wins
up to a few MiB; a copy goes up to the area's size (``run``'s block reserves 1 MiB per rank, layout.py).
Larger private arrays go through windows from ``WINDOW_MIN_BYTES`` on (measured: below it the kernel's
copies lose to the ring). Where there is no area (a sub-communicator, the MPI backend, a Topology), or
the array is too large for it and there are no windows, ``shared_memory_allreduce`` runs the ring.
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np

from minidist.cluster.shared_buffers import check_spec
from minidist.cluster.topology import topology_of
from minidist.collectives.common import UFUNCS
from minidist.collectives.pieces import split_sizes
from minidist.collectives.ring import ring_allreduce

# Measured on a 2-core VM, P = 2, ranks on their own cores (benchmarks/allreduce.md, issue 43's section)
MEETING_SECONDS = 2e-6        # one meeting (1.0-1.4 us when both ranks spin)
STEP_SECONDS = 32e-6          # one message step of the ring at 1 MiB, beyond its bytes
COPY_BYTES_PER_SECOND = 55e9  # one core copying 32 MiB (bytes read + written; 53-59 GB/s)
WHOLE_BYTES = 16 * 1024       # arrays up to this size: every rank reduces all of it (one meeting)
WINDOW_MIN_BYTES = 16 << 20   # `auto` sends larger arrays than the area holds through windows from here
                              # on: below it, the kernel's copies of private arrays lose to the ring
# A window's chunks (benchmarks/allreduce.md): where every peer's array is a view (in the shared block),
# 256 KiB, which keeps a chunk's parts in one core's L2 cache; where the kernel copies them between
# processes, the P − 1 peers' chunks together 1 MiB, fewer and larger system calls (at least 64 KiB each)
VIEW_CHUNK_BYTES, COPY_CHUNK_BYTES, MIN_CHUNK_BYTES = 256 * 1024, 1 << 20, 64 * 1024


def usable_area(comm):
    """The shared area of ``comm``, or None where it has none (a sub-communicator, the MPI backend, a
    communicator of another kind) or where the run models ranks on several machines (``run(...,
    link=Topology(...))``: no memory in common)."""
    area = comm.shared_area() if hasattr(comm, "shared_area") else None
    return None if area is None or topology_of(comm) is not None else area


def shared_area_bytes(comm) -> int:
    """The largest array (bytes) the shared area of ``comm`` holds a copy of; 0 where it has none."""
    area = usable_area(comm)
    return 0 if area is None else area.capacity


def has_windows(comm) -> bool:
    """True if ``shared_memory_allreduce`` reaches every rank's array of any size on ``comm`` (windows,
    cluster/window.py): the area is usable and processes may copy between each other."""
    area = usable_area(comm)
    return area is not None and area.windows


def shared_empty(comm, shape, dtype) -> np.ndarray:
    """A new array (uninitialised) for collectives on ``comm``: in the cluster's shared block where
    ``comm`` has a shared area with room left (cluster/shared_buffers.py: then ``shared_memory``'s
    peers reduce straight out of it, without a copy), else an ordinary ``np.empty``. shape and dtype as
    ``np.empty`` takes them, except dtypes that hold Python objects (``check_spec``: TypeError or
    ValueError naming the argument, on every path)."""
    shape, dtype = check_spec(shape, dtype)
    area = comm.shared_area() if hasattr(comm, "shared_area") else None
    array = area.buffers.empty(shape, dtype) if area is not None else None
    return np.empty(shape, dtype) if array is None else array


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
    rank. Without an area that reaches every rank's array, the ring (ring.py) does it.
    """
    if comm.world_size == 1:
        return flat
    area = usable_area(comm)
    if area is None or (flat.nbytes > area.capacity and not area.windows):     # (the same on every rank)
        return ring_allreduce(comm, flat, op)
    p, r, ufunc = comm.world_size, comm.rank, UFUNCS[op]
    arrays = area.arrays(flat.dtype, flat.size) if flat.nbytes <= area.capacity else None
    if flat.nbytes <= WHOLE_BYTES:                      # every rank reduces all of it: one meeting
        arrays[r][...] = flat
        area.meet(sent=[flat.nbytes] * p, received=[flat.nbytes] * p)
        return reduce_in_rank_order(ufunc, arrays, slice(None), flat)
    if arrays is None or area.buffers.holds(flat):      # the peers reach flat itself
        return window_allreduce(area, p, r, flat, flat, ufunc)
    arrays[r][...] = flat                               # else a copy of it, in the area
    return window_allreduce(area, p, r, flat, arrays[r], ufunc)


def window_allreduce(area, p: int, r: int, flat: np.ndarray, exposed: np.ndarray, ufunc) -> np.ndarray:
    """Every rank's ``exposed`` array (flat, or a copy of it in the area) in a window; rank r reduces
    piece r of all of them, a chunk at a time, into flat, and puts each reduced chunk into every other
    exposed array while it is still in the cache. Ranks whose exposed array is a copy then copy the
    other pieces out of it. flat: shape (n,), reduced in place; returns flat."""
    pieces, piece_bytes = split_pieces(flat, p)
    win = area.window(exposed, sent=piece_bytes, received=[piece_bytes[r]] * p)    # every input is there
    chunk = max(MIN_CHUNK_BYTES, COPY_CHUNK_BYTES // (p - 1)) if win.copies else VIEW_CHUNK_BYTES
    step = max(1, chunk // flat.itemsize)
    # a chunk of each peer's array is copied here (and my own, where the sum would overwrite it first)
    scratch = np.empty((p, step), flat.dtype) if win.copies or (r >= 2 and exposed is flat) else [None] * p
    mine = pieces[r]
    for lo in range(mine.start, mine.stop, step):
        hi = min(lo + step, mine.stop)
        parts = [win.get(q, lo, hi, scratch[q]) for q in range(p)]
        if r >= 2 and exposed is flat:     # the sum overwrites my own part before its turn: keep it
            parts[r] = scratch[r][:hi - lo]
            parts[r][...] = flat[lo:hi]
        total = reduce_in_rank_order(ufunc, parts, slice(None), flat[lo:hi])
        for q in range(p):
            if q != r:
                win.put(q, lo, total)
    area.meet(sent=[piece_bytes[r]] * p, received=piece_bytes)      # every piece is everywhere
    if exposed is not flat:
        for q in range(p):
            if q != r:
                flat[pieces[q]] = exposed[pieces[q]]
    return flat


def split_pieces(flat: np.ndarray, p: int) -> tuple[list[slice], list[int]]:
    """The P pieces of flat (np.array_split's rule, pieces.py) as slices, and their sizes in bytes."""
    sizes = split_sizes(flat.size, p)
    bounds = [0, *accumulate(sizes)]
    return [slice(bounds[q], bounds[q + 1]) for q in range(p)], [size * flat.itemsize for size in sizes]


def reduce_in_rank_order(ufunc, arrays: list[np.ndarray], piece: slice, out: np.ndarray) -> np.ndarray:
    """out = ((arrays[0][piece] ∘ arrays[1][piece]) ∘ arrays[2][piece]) ∘ ... (∘: ufunc); returns out.

    A fixed order, so every rank that computes it gets the same bits. out: P >= 2 arrays' piece shape.
    """
    ufunc(arrays[0][piece], arrays[1][piece], out=out)
    for other in arrays[2:]:
        ufunc(out, other[piece], out=out)
    return out
