"""This process's place in an MPI job, read from the launcher's environment (MPI itself is not imported).

Under ``mpiexec -n P`` every process runs the whole script, so without care a lesson prints everything P
times and P processes write the same figures. ``setup()`` (called when minidist.cluster, where the
backend is chosen, is imported) makes
rank 0 the only one that prints to stdout — the others write to os.devnull unless MINIDIST_ALL_RANKS_PRINT=1
— and ``is_quiet_rank()`` tells ``sim.plots`` not to write figures elsewhere. stderr is never silenced:
an error on any rank is shown.

A process killed by a signal or ended by ``os._exit`` says nothing, and MPICH's ``mpiexec`` names no rank
for it. So when ``python -m minidist run NN --mpi P`` starts the job (cluster/mpi_launch.py), each process
connects to the launcher's socket (MINIDIST_MPI_WATCH) and sends "<rank> <pid>"; before Python itself ends
the process it sends "exit" (a normal end) or "reported" (a failure it has printed). A connection that
closes without either is a process that died silently; the launcher names the first such rank.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys

RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")     # MPICH (Hydra), Open MPI
ALL_RANKS_PRINT = "MINIDIST_ALL_RANKS_PRINT"
WATCH = "MINIDIST_MPI_WATCH"
_watch: dict = {}


def launcher_rank() -> int | None:
    """This process's rank in the MPI job that mpiexec started, or None outside one."""
    for name in RANK_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def is_quiet_rank() -> bool:
    """True on the ranks other than 0 of an MPI job: they neither print nor write figures."""
    return launcher_rank() not in (None, 0)


def setup() -> None:
    """Under mpiexec: silence stdout on ranks != 0 (unless MINIDIST_ALL_RANKS_PRINT=1) and, in a job started
    by ``python -m minidist run --mpi``, report to the launcher's watch."""
    rank = launcher_rank()
    if rank is None:
        return
    if rank != 0 and os.environ.get(ALL_RANKS_PRINT, "") in ("", "0"):
        sys.stdout = open(os.devnull, "w")       # noqa: SIM115 - open for the life of the process
    path = os.environ.get(WATCH)
    if path and "socket" not in _watch:
        try:
            note = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            note.connect(path)
            note.sendall(f"{rank} {os.getpid()}\n".encode())
        except OSError:                          # no launcher listening (it ended): nothing to report to
            return
        _watch["socket"] = note
        atexit.register(_at_exit)


def _at_exit() -> None:
    # an uncaught exception has been printed (Python sets sys.last_value before printing it)
    python_ends("reported" if hasattr(sys, "last_value") else "exit")


def python_ends(how: str) -> None:
    """Tell the launcher that Python itself ends this process: how = "exit" (normal end) or "reported" (a
    failure this process has printed or will print). Does nothing outside a watched job."""
    note = _watch.pop("socket", None)
    if note is not None:
        try:
            note.sendall(f"{how}\n".encode())
        except OSError:
            pass
