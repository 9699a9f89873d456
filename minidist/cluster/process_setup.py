"""How a run's processes are set up and tied to the launcher, and the OS resources they share.

One BLAS thread per rank: P ranks share the machine's cores, so P BLAS thread pools would fight over
them. Under fork NumPy is already loaded in the parent, so environment variables are too late: the parent
sets its own BLAS to one thread (``threadpoolctl``) while it forks the workers, and the children inherit
it. Under spawn OMP/OPENBLAS/MKL_NUM_THREADS=1 in their environment apply before they import NumPy.

A core of its own: where there are at least as many cores as ranks, each rank is bound to one
(``pin_to_core``), so that two ranks never take turns on one core while another stays idle; with more
ranks than cores they are bound round-robin, the same number (give or take one) on every core.

Freed memory kept for reuse: glibc gives every block above 32 MiB a fresh ``mmap`` and returns it when
freed, so a rank allocating a 32 MiB array per step pays the kernel to zero 8,192 pages each time.
``keep_freed_memory`` asks glibc to keep such blocks, as caching allocators (PyTorch, MPI) do.

A rank never outlives its launcher: on Linux the kernel kills it when the launcher dies
(``die_with_parent``); elsewhere, and as a second guard, a waiting rank checks at each poll
(``exit_if_orphaned``). Under spawn the run's names in /dev/shm (segment, semaphores) are removed as soon
as every rank has opened them (``unlink_names``), so a launcher killed mid-run leaves none behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import signal
import sys
import threading
import traceback
import weakref

from multiprocess.synchronize import Semaphore, SemLock
from multiprocess.util import Finalize

BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3       # mallopt parameters (glibc's malloc.h)
KEEP_BYTES = 1 << 30                              # blocks below 1 GiB come from the heap and stay there
PR_SET_PDEATHSIG = 1                              # prctl option (linux/prctl.h)
ORPHANED = 70                                     # exit code of a rank whose launcher is gone
_launcher: int | None = None                      # in a rank: the pid of the process that started it


def settle_rank(rank: int, world_size: int, launcher: int) -> None:
    """In a rank's process, before its function runs: keep freed memory (``keep_freed_memory``) and
    take a core of its own (``pin_to_core``; ``launcher``: the pid of the process that started the run)."""
    keep_freed_memory()
    pin_to_core(rank, world_size, launcher)


def pin_to_core(rank: int, world_size: int, run_id: int = 0) -> bool:
    """Bind this rank to one core (of those it may run on), as MPI launchers bind ranks to cores; True if
    it did (a run of one rank is not bound). MINIDIST_PIN=0 turns it off. Rank r takes core (run_id + r)
    mod the count: the ranks of one run get consecutive cores, one each where there are enough, else
    round-robin (neighbours in rank order, a ring's, on different cores); runs started side by side by
    different processes (their pids as run_id) mostly start at different ones.

    Why: a rank that wakes another is often given the waker's core (the scheduler's wake-affine
    placement), and while the waker spins there (mailbox.py) the wakee waits for that core; on this
    project's VM two ranks then settle into paying a wake-up per step (benchmarks/allreduce.md). With
    more ranks than cores, unbound ranks crowd onto the waker's core the same way: the demo's 4 ranks on
    2 cores ran their steps in about half the time bound (benchmarks/demo.md).
    """
    if not hasattr(os, "sched_setaffinity") or os.environ.get("MINIDIST_PIN", "1") == "0":
        return False
    cores = sorted(os.sched_getaffinity(0))
    if world_size < 2:
        return False
    try:
        os.sched_setaffinity(0, {cores[(run_id + rank) % len(cores)]})
    except OSError:
        return False
    return True


def keep_freed_memory() -> bool:
    """In a rank's process: reuse freed large blocks instead of fresh zeroed pages (glibc only).

    Returns True if the setting took effect.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):      # not glibc (macOS, Windows, musl without it)
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))


@contextlib.contextmanager
def one_blas_thread(method: str):
    """While the workers start, make their BLAS use one thread (see the module docstring)."""
    if method == "fork":
        controller = _blas_controller()
        with controller.limit(limits=1) if controller else contextlib.nullcontext():
            yield                                    # forked children inherit the setting
        return
    saved = {k: os.environ.get(k) for k in BLAS_VARS}
    os.environ.update({k: "1" for k in BLAS_VARS})  # spawned children read them when they load BLAS
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _blas_controller():
    """threadpoolctl's view of the BLAS libraries loaded in this process now, or None. Looked up at every
    run (a few ms): a module imported since the last run may have brought a BLAS of its own (SciPy's)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:                              # then the workers keep the default thread count
        return None
    return ThreadpoolController()


def die_with_parent(launcher: int) -> None:
    """In a rank's process: end when ``launcher`` (the pid that started it) ends, however it ends.

    On Linux the kernel sends SIGKILL when the *thread* that started this process ends. That thread is
    the one inside ``run``, which leaves only after every rank has ended, so the signal comes exactly
    when the launcher dies. The launcher may already be gone before the request: then exit now.
    """
    global _launcher
    _launcher = launcher
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass                                      # then exit_if_orphaned is the only guard
    exit_if_orphaned()


def exit_if_orphaned() -> None:
    """In a rank: exit at once if the launcher that started it is gone (no-op in the launcher itself)."""
    if _launcher is not None and os.getppid() != _launcher:
        os._exit(ORPHANED)


@contextlib.contextmanager
def signals_deferred():
    """Hold back Python signal handlers (Ctrl-C's KeyboardInterrupt, a test timeout's alarm) until the end.

    Around ``Process.start``: an interrupt must not fall between the birth of a rank and the moment the
    launcher knows its pid. Handlers run only in the main thread, so elsewhere there is nothing to do.
    A stand-in left in place by an interrupt during the restore puts the real handler back and calls it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    deferring, me = [True], os.getpid()
    saved = {s: h for s in signal.valid_signals() if callable(h := signal.getsignal(s))}

    def stand_in(sig, frame):
        if deferring[0] and os.getpid() == me:        # (a rank forked meanwhile gets the real handler)
            return caught.append(sig)
        signal.signal(sig, saved[sig])
        return saved[sig](sig, frame)

    try:
        for sig in saved:
            signal.signal(sig, stand_in)
        yield
    finally:
        deferring[0] = False
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        for sig in caught:                            # now they run, and may raise
            signal.raise_signal(sig)


class _Doorbell(Semaphore):
    """A named semaphore whose name starts with the run's prefix, so that a leak is easy to attribute."""

    def __init__(self, prefix: str, ctx):
        self._prefix = prefix
        super().__init__(0, ctx=ctx)

    def _make_name(self) -> str:
        return f"/{self._prefix}-{next(SemLock._rand)}"


def shared_resources(ctx, method: str, nbytes: int, world_size: int, prefix: str):
    """(block, SharedMemory or None, doorbells): the run's shared block and one semaphore per rank.

    Under fork the block is anonymous shared memory and the semaphores lose their names at once: the
    children inherit them, nothing appears in /dev/shm. Under spawn the children open them by name.
    """
    if method == "fork":          # MAP_SHARED | MAP_ANONYMOUS
        return memoryview(mmap.mmap(-1, nbytes)), None, [ctx.Semaphore(0) for _ in range(world_size)]
    from multiprocess.shared_memory import SharedMemory
    shm, bells = SharedMemory(name=prefix, create=True, size=nbytes), []
    try:
        bells.extend(_Doorbell(prefix, ctx) for _ in range(world_size))
    except BaseException:
        unlink_names(shm, bells)
        shm.close()
        bells.clear()           # unmapped now, not when the traceback that holds this frame goes
        raise
    return shm.buf, shm, bells


def unlink_names(shm, doorbells) -> None:
    """Remove the run's names from /dev/shm; processes that have them open keep using them. Idempotent."""
    if shm is not None:
        try:
            shm.unlink()                              # also tells the resource tracker
        except FileNotFoundError:
            pass
    for bell in doorbells:             # multiprocess's own clean-up of a semaphore, run now, once
        for ref in weakref.getweakrefs(bell):
            if isinstance(ref.__callback__, Finalize):
                try:
                    ref.__callback__()
                except FileNotFoundError:
                    pass


def release_block(block, shm, doorbells: list) -> None:
    """Unmap the shared block and close the doorbells in this process, now rather than when their last
    reference goes: the traceback of a failed run's error keeps the launcher's frame, which holds them.
    A semaphore closes when its object is freed, so the list is emptied in place (the parent Endpoint
    shares it). A block of which some view survives is left to the garbage collector."""
    doorbells.clear()
    if block is None:
        return
    try:
        block.release()
        if shm is not None:
            shm.close()
    except BufferError:
        pass


def leave_block(shared) -> None:
    """In a rank, at its end: under spawn, close its map of the block (``shared``, a SharedMemory) now.
    Arrays of the block that outlive the rank's function (shared buffers kept in a global: shared_buffers.py)
    keep the map until the process exits; the SharedMemory is then told that there is nothing left to
    close, or its finalizer would complain at exit. Under fork (a memoryview) there is nothing to do."""
    if hasattr(shared, "close"):
        try:
            shared.close()
        except BufferError:
            shared._buf = shared._mmap = None      # (multiprocess's SharedMemory: what close() would drop)


def check_picklable(fn, args) -> None:
    """Under spawn, fn and args travel to the ranks pickled: refuse at once (TypeError) if they cannot."""
    from multiprocess.reduction import ForkingPickler
    try:
        ForkingPickler.dumps((fn, args))
    except Exception as exc:
        raise TypeError(f"start_method='spawn' sends fn and args to new processes by pickling them, and "
                        f"{getattr(fn, '__name__', fn)!r} with its args cannot be pickled: "
                        f"{type(exc).__name__}: {exc}") from exc


def explain_exception(exc: BaseException) -> tuple[str, str]:
    """('ValueError: message', traceback) — even for an exception whose __str__ itself raises."""
    try:
        text = str(exc)
    except BaseException as err:  # noqa: BLE001
        text = f"<str() of the exception raised {type(err).__name__}>"
    return f"{type(exc).__name__}: {text}", traceback.format_exc()     # (format_exc survives a bad __str__)
