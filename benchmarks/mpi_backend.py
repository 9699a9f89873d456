"""minidist's ring allreduce on the MPI backend against MPI_Allreduce, in the same MPI job.

    python benchmarks/mpi_backend.py            # launches mpiexec -n 2 and -n 4, prints a table
    mpiexec -n 4 python benchmarks/mpi_backend.py --worker      # one job by hand

Bus bandwidth as nccl-tests defines it: busbw = 2 (P - 1) / P * bytes / seconds (the bytes each link
carries in a bandwidth-optimal allreduce). Latency: the median seconds of one allreduce of 4 KiB. Both
sides run in the same processes on the same data (float32), timed between barriers, median of repeats.
Targets (issue 23): ring >= 0.8x MPI's bus bandwidth at 32 MiB, ring <= 3x MPI's latency at 4 KiB.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = {"4 KiB": 4 * 2**10, "32 MiB": 32 * 2**20}
REPEATS = {"4 KiB": 200, "32 MiB": 7}


def worker() -> None:
    from minidist.cluster import run
    from minidist.collectives import allreduce

    def measure(comm):
        rows = {}
        for name, nbytes in SIZES.items():
            x = np.ones(nbytes // 4, np.float32)
            times = {}
            for algorithm in ("ring", "mpi"):
                allreduce(comm, x, algorithm=algorithm)                   # warm up
                seconds = []
                for _ in range(REPEATS[name]):
                    comm.barrier()
                    start = time.perf_counter()
                    allreduce(comm, x, algorithm=algorithm)
                    seconds.append(time.perf_counter() - start)
                times[algorithm] = float(np.median(seconds))
            rows[name] = times
        return rows

    results = run(measure, _size(), timeout=600)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        p = len(results)
        for name, nbytes in SIZES.items():
            ring = max(r[name]["ring"] for r in results)        # the slowest rank sets the time
            mpi = max(r[name]["mpi"] for r in results)
            bus = 2 * (p - 1) / p * nbytes
            print(f"| {p} | {name} | {ring * 1e6:.0f} us | {mpi * 1e6:.0f} us | {bus / ring / 1e9:.2f} GB/s "
                  f"| {bus / mpi / 1e9:.2f} GB/s | {mpi / ring:.2f}x busbw, {ring / mpi:.2f}x latency |",
                  flush=True)


def _size() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help="run inside mpiexec")
    parser.add_argument("--procs", default="2,4")
    args = parser.parse_args()
    if args.worker:
        worker()
        return 0
    from minidist.cluster.mpi_launch import launch, mpi_available

    if not mpi_available():
        print('MPI is not installed: pip install -e ".[mpi]"')
        return 1
    print("| P | size | ring (minidist, MPI backend) | MPI_Allreduce | ring busbw | MPI busbw "
          "| ring vs MPI |")
    print("|---|---|---|---|---|---|---|")
    for p in map(int, args.procs.split(",")):
        job = launch(p, [__file__, "--worker"], capture=True)
        print(job.stdout, end="", flush=True)
        if job.returncode:
            print(job.stderr[-2000:])
            return job.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
