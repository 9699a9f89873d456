"""The MPI peer of the benchmarks: the command that runs a benchmark script's own ``--mpi-worker`` mode
under ``mpiexec -n P`` (MPICH from ``pip install mpi4py mpich``), or None when MPI is not installed."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def mpi_worker_command(world_size: int, script: str, *worker_args: str) -> list[str] | None:
    # The mpiexec beside this Python (a venv's, from the mpich wheel) before any other on PATH.
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    if mpiexec is None:
        return None
    return [mpiexec, "-n", str(world_size), sys.executable, script, "--mpi-worker", *worker_args]
