"""Copying straight out of another rank's array: Linux's cross-memory attach (``process_vm_readv``).

A message bigger than the mailbox cannot be sent without waiting for the reader anyway, so for those
the cluster does what MPICH's shared-memory channel does with large messages (its "CMA" path): the
sender puts only a header and the address of its array in the mailbox (messages.py, ``Outgoing``) and
waits; the reader copies the payload straight out of the sender's memory with one system call per
piece — into its target, or through a small buffer that stays in its cache when it must reduce
(``out = op(base, incoming)``) — and then frees the slot, which tells the sender that its array may
change again. Each byte crosses the memory bus once, against twice through a mailbox (copy in, copy
out), and the two ranks meet once per message instead of once per segment.

``process_vm_readv(pid, local, remote)`` copies bytes from process ``pid``'s address space into ours;
the kernel allows it between processes of the same user (and, under the Yama security module, only
for a process that has said so: ``enable``). ``available()`` says whether this system has it;
``MINIDIST_CROSS_MEMORY=0`` in the environment turns it off (then large messages stream through the
mailbox, as everywhere but Linux).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
import sys
from contextlib import contextmanager

import numpy as np

from .mailbox import Aborted, Endpoint

PR_SET_PTRACER, PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1).value     # linux/prctl.h (Yama)
PIECE_BYTES = 1 << 20           # bytes pulled per call when reducing: about one core's L2 cache
REMOTE_MIN_BYTES = 1 << 20      # and above the mailbox's capacity: only such messages are read remotely
ADDRESS = struct.Struct("<qq")  # what the slot of a remote message holds after its header: pid, address
GONE_GRACE = 2.0                # seconds a reader whose sender vanished waits for the launcher's abort


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _load(name: str):
    """libc's process_vm_readv or process_vm_writev, typed, or None where there is none (not Linux,
    not glibc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        call = getattr(libc, name)
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_ssize_t
    call.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.POINTER(_IOVec),
                     ctypes.c_ulong, ctypes.c_ulong]
    return call


_readv, _writev = _load("process_vm_readv"), _load("process_vm_writev")


def available() -> bool:
    """True if large messages may be copied across processes here: Linux with process_vm_readv, not
    turned off by MINIDIST_CROSS_MEMORY=0, not forbidden by Yama, and a test read of this process's own
    memory works (a sandbox may refuse the call)."""
    if _readv is None or _writev is None or os.environ.get("MINIDIST_CROSS_MEMORY", "1") == "0" \
            or _yama_scope() >= 2:
        return False
    probe, copy = np.arange(8, dtype=np.int64), np.zeros(8, dtype=np.int64)
    try:
        pull(os.getpid(), probe.ctypes.data, copy.ctypes.data, probe.nbytes)
    except OSError:
        return False
    return bool((copy == probe).all())


def _yama_scope() -> int:
    """Yama's ptrace_scope (0 where there is no Yama): 2 and 3 forbid reading a sibling's memory at all."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as scope:
            return int(scope.read())
    except (OSError, ValueError):
        return 0


def enable() -> bool:
    """In a rank, at its start: True if it sends large messages this way (``available``); then it lets
    the other ranks read its memory where Yama would allow only ancestors (``ptrace_scope`` 1; without
    Yama, processes of one user may read each other already). Every rank decides alike: one system, one
    environment."""
    if not available():
        return False
    try:
        ctypes.CDLL(None).prctl(PR_SET_PTRACER, ctypes.c_ulong(PR_SET_PTRACER_ANY), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    return True


def goes_remote(ep: Endpoint, nbytes: int) -> bool:
    """True if a message of ``nbytes`` is to be read straight out of the sender's memory."""
    return ep.cross_memory and nbytes > ep.layout.capacity and nbytes >= REMOTE_MIN_BYTES


def location(ep: Endpoint, array: np.ndarray) -> int:
    """Where another rank finds ``array``: -(offset + 1) where it lies in the shared block (a shared
    buffer, shared_buffers.py: read in place, ``in_block``), else its address in this process (> 0)."""
    address = array.ctypes.data
    offset = address - ep.block_address
    return -(offset + 1) if 0 <= offset and offset + array.nbytes <= ep.raw.nbytes else address


def in_block(ep: Endpoint, where: int, nbytes: int, dtype) -> np.ndarray:
    """The array at ``location`` ``where`` < 0, ``nbytes`` of ``dtype``: a view of this rank's map of the
    block."""
    start = -where - 1
    return ep.raw[start:start + nbytes].view(dtype)


@contextmanager
def reaching(ep: Endpoint, what: str, instead: str):
    """Around a copy from or to another rank's memory: an OSError becomes Aborted where the run is
    ending (the other process died or stopped: the launcher names it), else a RuntimeError saying that
    this rank could not ``what``, and that MINIDIST_CROSS_MEMORY=0 ``instead``."""
    try:
        yield
    except OSError as error:
        if ep.await_abort(GONE_GRACE):
            raise Aborted() from error
        raise RuntimeError(f"rank {ep.rank} could not {what} ({error}); MINIDIST_CROSS_MEMORY=0 "
                           f"{instead}") from error


def post_address(ep: Endpoint, start: int, payload: np.ndarray) -> None:
    """Write where a remote message's payload is (this process, ``location``) at byte ``start`` of the
    shared block: the slot's payload area."""
    ADDRESS.pack_into(ep.buf, start, ep.pid, location(ep, payload))


def receive_remote(ep: Endpoint, src: int, start: int, target: np.ndarray, ufunc, base) -> None:
    """Copy (or combine) a remote message from world rank ``src`` into the 1-D ``target`` (see
    ``pull_into``); the slot's payload at byte ``start`` says where it is (``post_address``)."""
    pid, address = ADDRESS.unpack_from(ep.buf, start)
    if address < 0:                  # in the shared block: no system call, no copy through the cache
        incoming = in_block(ep, address, target.nbytes, target.dtype)
        if ufunc is None:
            target[...] = incoming
        else:
            ufunc(target if base is None else base, incoming, out=target)
        return
    if ufunc is not None and ep.scratch is None:
        ep.scratch = np.empty(PIECE_BYTES, np.uint8)      # one small buffer per rank, reused
    with reaching(ep, f"read the message of rank {src} from its memory",
                  "sends large messages through the mailbox instead"):
        pull_into(pid, address, target, ufunc, base, ep.scratch)


def pull(pid: int, remote: int, local: int, nbytes: int) -> None:
    """Copy ``nbytes`` bytes at address ``remote`` of process ``pid`` to address ``local`` of this one.

    Raises OSError (with the errno) if the kernel refuses or the other process is gone.
    """
    _copy(_readv, "process_vm_readv from", pid, local, remote, nbytes)


def push(pid: int, local: int, remote: int, nbytes: int) -> None:
    """Copy ``nbytes`` bytes at address ``local`` of this process to address ``remote`` of process
    ``pid`` (``process_vm_writev``; window.py's ``put``). Raises OSError as ``pull`` does."""
    _copy(_writev, "process_vm_writev to", pid, local, remote, nbytes)


def _copy(call, what: str, pid: int, local: int, remote: int, nbytes: int) -> None:
    done = 0
    while done < nbytes:          # the kernel may copy less than asked (then the rest is asked again)
        here, there = _IOVec(local + done, nbytes - done), _IOVec(remote + done, nbytes - done)
        got = call(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)
        if got <= 0:
            err = ctypes.get_errno() if got < 0 else 0
            why = os.strerror(err) if err else "no data"
            raise OSError(err, f"{what} process {pid}: {why}")
        done += got


def pull_into(pid: int, remote: int, target: np.ndarray, ufunc=None, base: np.ndarray | None = None,
              scratch: np.ndarray | None = None) -> None:
    """Receive a remote array of target's dtype and size into the 1-D contiguous ``target``.

    ufunc None: target = incoming, copied straight in. Else target = ufunc(base, incoming) (base
    defaults to target), piece by piece through ``scratch`` (a uint8 buffer of PIECE_BYTES or more).
    """
    if ufunc is None:
        pull(pid, remote, target.ctypes.data, target.nbytes)
        return
    step = max(1, PIECE_BYTES // target.itemsize)
    incoming = np.frombuffer(scratch, target.dtype, step)
    for lo in range(0, target.size, step):
        hi = min(lo + step, target.size)
        pull(pid, remote + lo * target.itemsize, incoming.ctypes.data, (hi - lo) * target.itemsize)
        ufunc(target[lo:hi] if base is None else base[lo:hi], incoming[:hi - lo], out=target[lo:hi])
