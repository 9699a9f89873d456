"""How each rank's process is set up: one BLAS thread, and freed memory kept for reuse.

One BLAS thread per rank: P ranks share the machine's cores, so P BLAS thread pools would fight over
them. Under fork NumPy is already loaded in the parent (its thread pool exists), so environment variables
are too late. The parent sets its own BLAS to one thread with ``threadpoolctl`` (it comes with
scikit-learn, a dependency) while it forks the workers, and restores it afterwards: the children inherit
the setting and never start a BLAS thread pool. (Setting it inside each child instead makes OpenBLAS
start a pool thread there that spins for ~40 ms of CPU before it sleeps.) Under spawn the children start a
new interpreter: OMP/OPENBLAS/MKL_NUM_THREADS=1 in their environment apply before they import NumPy.

Freed memory kept for reuse: glibc's malloc gives every block above 32 MiB its own fresh ``mmap`` and
returns it to the kernel when freed, so a rank that allocates a 32 MiB array per step (a collective's
result, a gradient) pays for the kernel to zero 8,192 new pages every time: about 3 ms, as long as
moving the data. ``keep_freed_memory`` asks glibc to serve such blocks from the heap and keep freed
ones, as the caching allocators of PyTorch and MPI libraries do. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os

BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3       # mallopt parameters (glibc's malloc.h)
KEEP_BYTES = 1 << 30                              # blocks below 1 GiB come from the heap and stay there


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


_blas = None


def _blas_controller():
    """threadpoolctl's view of the BLAS libraries loaded in this process (found once), or None."""
    global _blas
    if _blas is None:
        try:
            from threadpoolctl import ThreadpoolController
            _blas = ThreadpoolController()
        except ImportError:                          # then the workers keep the default thread count
            _blas = False
    return _blas or None
