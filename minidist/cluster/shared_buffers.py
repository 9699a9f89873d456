"""Shared buffers: arrays that live in the cluster's shared block, so every rank can see them in place.

A collective over private arrays copies: each byte another rank needs crosses between the address
spaces (a mailbox, or the kernel's cross-memory copy). An array that lives in memory every rank has
mapped needs no copy at all: a peer reads and writes it like its own, which is why NCCL and MPI let a
program allocate its communication buffers from the library (``ncclMemAlloc``, ``MPI_Alloc_mem``,
``MPI_Win_allocate_shared``). Here each rank owns ``Layout.buffer_bytes`` of the block (64 MiB by
default; pages are only taken once written) and hands them out:

    x = comm.shared_area().buffers.empty((n,), np.float32)     # None when the region is full
    allreduce(comm, x, out=x, algorithm="shared_memory")        # peers reduce straight out of x

(``minidist.collectives.shared_empty`` falls back to an ordinary array.) A window (window.py) finds
an array of the block by its offset and gives the other ranks a view of it. The memory is free again once
the array and every view of it are gone; the allocator is first fit over this rank's region, in pages,
so that an array never shares a page, and with it a cache line, with another.
"""

from __future__ import annotations

import math
import operator
import weakref

import numpy as np

from .cross_memory import location
from .layout import PAGE


def check_spec(shape, dtype) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of a new array, read as ``np.empty`` reads them: shape one int or a sequence of
    ints (no floats, no bools: TypeError), each >= 0 (ValueError); dtype any NumPy dtype whose items hold
    no Python objects (TypeError: a refcounted item cannot live in memory another process reads)."""
    sizes = shape if np.iterable(shape) else (shape,)
    try:
        if any(isinstance(size, (bool, np.bool_)) for size in sizes):
            raise TypeError
        shape = tuple(operator.index(size) for size in sizes)
    except TypeError:
        raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(size < 0 for size in shape):
        raise ValueError(f"shape must hold sizes >= 0, got {shape}")
    try:
        dtype = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"dtype must be a NumPy dtype, got {dtype!r} ({error})") from None
    if dtype.hasobject:
        raise TypeError(f"dtype must hold no Python objects (their references cannot be shared between "
                        f"processes), got {dtype}")
    return shape, dtype


class SharedBuffers:
    """This rank's region of the shared block (``ep``: its Endpoint), handed out as arrays."""

    def __init__(self, ep):
        self._ep = ep
        self.start, self.capacity = ep.layout.buffers(ep.rank), ep.layout.buffer_bytes
        self._free = [(0, self.capacity)]          # (offset, bytes) in the region, sorted, merged

    @property
    def free_bytes(self) -> int:
        """Bytes not handed out (perhaps in several pieces)."""
        return sum(size for _, size in self._free)

    def holds(self, array: np.ndarray) -> bool:
        """True if ``array``'s memory lies in the shared block (of any rank), so every rank can see it."""
        return location(self._ep, array) < 0

    def empty(self, shape, dtype) -> np.ndarray | None:
        """A new C-contiguous array of ``shape`` and ``dtype`` in the shared block (uninitialised), or
        None if no free piece of the region holds it, or its items take no bytes (a dtype such as
        ``"V0"``: nothing to share). Bad arguments: as ``check_spec``."""
        shape, dtype = check_spec(shape, dtype)
        if dtype.itemsize == 0:
            return None
        nbytes = max(PAGE, -(-math.prod(shape) * dtype.itemsize // PAGE) * PAGE)
        for i, (offset, size) in enumerate(self._free):
            if size >= nbytes:
                self._free[i:i + 1] = [(offset + nbytes, size - nbytes)] if size > nbytes else []
                start = self.start + offset
                # a root array whose base is a memoryview: every view of it then keeps *it* alive, so
                # the memory is given back only when the last view is gone
                root = np.frombuffer(self._ep.buf[start:start + math.prod(shape) * dtype.itemsize], dtype)
                weakref.finalize(root, self._release, offset, nbytes)
                return root if root.shape == shape else root.reshape(shape)
        return None

    def _release(self, offset: int, nbytes: int) -> None:
        """Give back [offset, offset + nbytes), merging it with free neighbours."""
        pieces = sorted([*self._free, (offset, nbytes)])
        merged = [pieces[0]]
        for start, size in pieces[1:]:
            last_start, last_size = merged[-1]
            if last_start + last_size == start:
                merged[-1] = (last_start, last_size + size)
            else:
                merged.append((start, size))
        self._free = merged
