"""Which machine ``run`` uses: the simulated cluster (launcher.py, forked processes joined by shared
memory) or, under ``mpiexec`` or with MINIDIST_BACKEND=mpi, the MPI processes (mpi_backend.py).

``run`` and ``run_traced`` here take the same arguments as launcher.py's and return the same things;
``minidist.cluster`` exports these. mpi4py is imported only when MPI is chosen. Under ``mpiexec`` this
module also sets the process up when it is imported (minidist/cluster/mpi_rank.py: only rank 0 prints; a job
started by ``python -m minidist run --mpi`` is watched); elsewhere that reads the environment and does
nothing.
"""

from __future__ import annotations

import functools

from minidist.cluster.mpi_rank import setup as _mpi_process_setup

from . import launcher
from .ledger import Trace
from .mpi_backend import mpi_chosen, refuse_fork_under_mpi, run_mpi, run_traced_mpi

_mpi_process_setup()


@functools.wraps(launcher.run)
def run(fn, world_size: int, *args, timeout: float = 60.0, link=None, device=None, start_method=None,
        mailbox_bytes: int = 2 * 2**20) -> list:
    if mpi_chosen():                  # start_method does not apply: mpiexec started the processes
        return run_mpi(fn, world_size, args, timeout, link, device, mailbox_bytes)[0]
    refuse_fork_under_mpi()
    return launcher.run(fn, world_size, *args, timeout=timeout, link=link, device=device,
                        start_method=start_method, mailbox_bytes=mailbox_bytes)


@functools.wraps(launcher.run_traced)
def run_traced(fn, world_size: int, *args, **options) -> tuple[list, Trace]:
    if mpi_chosen():
        options.pop("start_method", None)
        return run_traced_mpi(fn, world_size, args, **options)
    refuse_fork_under_mpi()
    return launcher.run_traced(fn, world_size, *args, **options)
