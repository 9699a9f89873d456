"""A window: every rank's array of one collective call, read and written in place by every other rank.

MPI calls this one-sided communication (MPI_Win_create, MPI_Get, MPI_Put, MPI_Win_fence): each rank
exposes an array; between two fences any rank may read or write any other's, and the owner takes no
part. Inside one machine it needs no message at all, which is how MPICH and NCCL move large arrays
between the processes of one node:

    win = comm.shared_area().window(flat, sent, received)   # a meeting (fence): every flat is exposed
    part = win.get(q, lo, hi, scratch)       # elements lo:hi of rank q's array: a view, or a copy
    win.put(q, lo, values)                   # write values into rank q's array from element lo on
    comm.shared_area().meet(sent, received)  # the closing fence: every get and put of every rank is done

How rank r reaches rank q's array (all arrays of one window have the same dtype and size: the call's
checksum, which every meeting checks, says so):

- q's array lies in the cluster's shared block (a shared buffer, shared_buffers.py, or q's slot of the
  area): a view of the block. A get costs nothing, a put is one NumPy copy.
- a private array of q's process: the kernel copies between the two address spaces (cross_memory.py):
  a get is one ``process_vm_readv`` into ``scratch``, a put one ``process_vm_writev``. Where there are
  no such copies (``SharedArea.windows`` False), ``window`` takes only arrays of the block.

What keeps it safe is the caller's duty, as in MPI: between the fences no two ranks write the same
elements, and nobody reads elements that another writes (shared_memory.py: rank r reads and writes only
piece r of every array). No owner leaves the call before the closing fence, so no array is freed while
another rank reads or writes it; a rank whose run is aborted meanwhile raises Aborted at that fence.
"""

from __future__ import annotations

import numpy as np

from .cross_memory import in_block, pull, push, reaching


class Window:
    """The arrays of one call, as ``SharedArea.window`` opens it: ``places[q]`` is (pid, location) of
    rank q's array (``cross_memory.location``: in the shared block, or an address in process pid);
    ``flat`` is this rank's own."""

    def __init__(self, ep, flat: np.ndarray, places: list[tuple[int, int]]):
        self._ep, self._flat, self._places = ep, flat, places
        self._views = {q: in_block(ep, where, flat.nbytes, flat.dtype)
                       for q, (_, where) in enumerate(places) if where < 0 and q != ep.rank}
        self.copies = len(self._views) < len(places) - 1      # some peer's array is reached by copies

    def get(self, q: int, lo: int, hi: int, scratch: np.ndarray | None) -> np.ndarray:
        """Elements lo:hi of rank q's array: a view where this process can see it (q is this rank, or
        its array lies in the shared block), else copied into ``scratch`` (flat's dtype, at least
        hi - lo elements, or None where every peer's array is a view: ``copies`` is False; the returned
        view is of scratch)."""
        if q == self._ep.rank:
            return self._flat[lo:hi]
        if q in self._views:
            return self._views[q][lo:hi]
        pid, address = self._places[q]
        into = scratch[:hi - lo]
        with self._reaching(q):
            pull(pid, address + lo * self._flat.itemsize, into.ctypes.data, into.nbytes)
        return into

    def put(self, q: int, lo: int, values: np.ndarray) -> None:
        """Write ``values`` (contiguous, flat's dtype) into rank q's array from element lo on."""
        if q == self._ep.rank:
            self._flat[lo:lo + values.size] = values
        elif q in self._views:
            self._views[q][lo:lo + values.size] = values
        else:
            pid, address = self._places[q]
            with self._reaching(q):
                push(pid, values.ctypes.data, address + lo * self._flat.itemsize, values.nbytes)

    def _reaching(self, q: int):
        return reaching(self._ep, f"reach the array of rank {q} in its memory",
                        "reduces large arrays by messages instead")
