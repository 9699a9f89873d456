"""Start a script on P MPI processes: ``python -m minidist run 05 --mpi 4`` runs lesson 05 as

    mpiexec -n 4 python lessons/05_collectives.py

with the ``mpiexec`` of this Python's environment (the mpich wheel puts one beside the interpreter)
before any other on PATH. When the processes outnumber the cores, MPICH is asked to yield the CPU
while it waits (its ranks poll), so that P > cores still progresses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from minidist.cluster.mpi_rank import WATCH

from .mpi_watch import RankWatch

# MPICH: yield the core between polls (a polling rank otherwise starves the ranks that share its core)
YIELD_SETTINGS = {"MPIR_CVAR_POLLS_BEFORE_YIELD": "1", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}


def find_mpiexec() -> str | None:
    """The mpiexec beside this Python (a venv's), else the first on PATH, else None."""
    return shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")


def mpi_available() -> bool:
    """True when mpi4py can be imported (without importing it: that would start MPI) and mpiexec exists."""
    from importlib.util import find_spec

    return find_spec("mpi4py") is not None and find_mpiexec() is not None


def mpiexec_command(nprocs: int, argv: list[str]) -> list[str]:
    """``[mpiexec, -n, P, python, *argv]``; RuntimeError with the install command if MPI is missing."""
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"the number of MPI processes must be an int >= 1, got {nprocs!r}")
    if not mpi_available():
        raise RuntimeError('running on MPI needs mpi4py and mpiexec: pip install -e ".[mpi]" (mpi4py and the '
                           "mpich wheel, which brings mpiexec)")
    return [find_mpiexec(), "-n", str(nprocs), sys.executable, *argv]


def mpi_environment(nprocs: int) -> dict[str, str]:
    """This process's environment for the MPI job: MPICH yields the CPU when ranks outnumber cores."""
    env = dict(os.environ)
    env.pop("MINIDIST_BACKEND", None)           # mpiexec's own variables choose the MPI backend
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if nprocs > cores:
        for name, value in YIELD_SETTINGS.items():
            env.setdefault(name, value)
    return env


def launch(nprocs: int, argv: list[str], timeout: float | None = None, capture: bool = False):
    """Run ``python *argv`` on ``nprocs`` MPI processes; return the CompletedProcess (stdout/stderr as
    text with ``capture=True``). A process that dies without Python's help is named on stderr (mpi_watch.py).
    Shared memory that an aborted job's MPICH left behind is removed."""
    command, env = mpiexec_command(nprocs, argv), mpi_environment(nprocs)
    before, watch = set(_mpich_segments()), RankWatch()
    try:
        job = subprocess.run(command, env={**env, WATCH: watch.path}, timeout=timeout, capture_output=capture,
                             text=True, check=False)
    finally:
        watch.close()
        remove_orphaned_segments(set(_mpich_segments()) - before)
    report = watch.silent_death(job.returncode)
    if report and capture:
        job.stderr += "\n" + report + "\n"
    elif report:
        print("\n" + report, file=sys.stderr, flush=True)
    return job


SHM = Path("/dev/shm")


def _mpich_segments() -> list[Path]:
    return list(SHM.glob("mpich_shm_*")) if SHM.is_dir() else []


def remove_orphaned_segments(candidates: set[Path], patience: float = 3.0) -> None:
    """Unlink those of ``candidates`` (MPICH's /dev/shm segments) that no live process maps any more: a job
    ended by MPI_Abort never unlinks its segment, and every failed job would leave megabytes in RAM. An
    aborted job's processes may take a moment to exit, so this waits up to ``patience`` seconds for them."""
    deadline = time.monotonic() + patience
    while True:
        mapped = _mapped_shm()
        for path in list(candidates):
            if str(path) not in mapped:
                path.unlink(missing_ok=True)
                candidates.discard(path)
        if not candidates or time.monotonic() > deadline:
            return
        time.sleep(0.1)


def _mapped_shm() -> set[str]:
    """Paths under /dev/shm that some live process has mapped (from /proc/PID/maps)."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped.update(line.split()[-1] for line in maps.read_text().splitlines() if "/dev/shm/" in line)
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    return mapped
