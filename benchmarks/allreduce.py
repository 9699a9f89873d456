"""Allreduce bus bandwidth: minidist against MPICH (mpi4py) and torch.distributed (gloo), as a fraction of
what one core can copy.

    PYTHONPATH=. python benchmarks/allreduce.py [--sizes 4K,1M,32M] [--world-sizes 2,4,8] [--oversubscribe]
        [--peers mpich,gloo,floor] [--repeats 1]

World sizes above the machine's cores are skipped unless ``--oversubscribe`` (ranks sharing a core measure
the scheduler, not the transport). For each world size P and message size (float32 arrays of S bytes)
every peer runs allreduce-sum untimed for ~0.3 s (this VM's cores run slower for a while after idling,
and minidist's ranks sleep when they wait), then in 5 blocks of a few calls between barriers; t, the time
of one allreduce, is the slowest rank's average in its fastest block (the machine is shared: other jobs
only ever add time); ``--repeats N`` runs minidist N times and keeps the best. Reported, as nccl-tests
defines them:

    algbw = S / t          busbw = algbw · 2 (P − 1) / P

(busbw is the per-link rate a ring would need: comparable across P.) minidist runs six ways: the ring
in place (``allreduce(comm, x, out=x)``, what DataParallel's buckets call), the ring by default (a new
result array: one more pass over x), ``auto`` in place, ``shared_memory`` in place, and
``shared_memory`` and the ring in place on a *shared buffer* (x from ``shared_empty``: it lives in the
cluster's shared memory, as DataParallel's buckets do, and the peers read it in place). The peers run in
the same invocation: MPICH through ``mpiexec -n P python benchmarks/allreduce.py --mpi-worker``
(mpi4py), gloo through P processes running ``--gloo-worker``. A peer that is not installed is skipped.

The yardstick is one core's copy bandwidth, measured first in the same run (NumPy copies a 32 MiB array;
bytes read + written per second): each busbw is also printed as a fraction of it. Every byte a ring moves
must at least be read once and written once, so at that rate its bus bytes take

    t_bytes = 2 · 2 (P − 1)/P · S / copy_bandwidth

(at least: P ranks copying at once share the memory bus, so each copies slower — measured too, and what
a ring moving its bytes at that rate would reach: ``ring_ceiling``) and the ring's *overhead per step*
is (t − t_bytes) / (2 (P − 1)): what each of its 2(P − 1) steps costs beyond moving its bytes
(hand-offs, wake-ups, Python).
The last column, the ring's CPU time per call (the busiest rank's, averaged over all its calls), says
what the transport costs whatever the load on the machine: a rank asleep in a wait costs none, one
spinning (at most 50 us a wait) does.

The "floor" peer (benchmarks/floor.py, arrays up to 64 KiB, P a power of two) is the same recursive
doubling written in bare Python — forked processes, one shared-memory slot and two semaphores per ordered
pair, no minidist code: the least a short allreduce between Python processes costs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from floor import floor_allreduce  # benchmarks/floor.py, beside this script
from gloo import run_gloo_workers  # benchmarks/gloo.py, beside this script
from mpi_peer import mpi_worker_command  # benchmarks/mpi_peer.py, beside this script
from timing import BLOCKS, best_block  # benchmarks/timing.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    return int(text[:-1]) * UNITS[text[-1].upper()] if text[-1].upper() in UNITS else int(text)


FLOOR_MAX_BYTES = 64 * 1024  # the floor is measured for short arrays only
WARMUP_SECONDS = 0.3  # this VM's cores run slower for a while after they idle: warm them up first


def iterations(nbytes: int) -> int:
    """Allreduces per block: ~40 ms of traffic at ~1 GB/s, at least 1 and at most 40."""
    return int(min(40, max(1, 4e7 // max(nbytes, 1))))


def warmup_calls(nbytes: int) -> int:
    """Untimed allreduces first: ~WARMUP_SECONDS at a guessed 100 us + 1 ns/byte, at most 2000.

    A fixed function of the size, so that every rank (of every peer) makes the same number of calls.
    """
    return int(min(2000, max(1, WARMUP_SECONDS / (100e-6 + nbytes / 1e9))))


def timed_loop(allreduce_once, barrier, nbytes: int) -> float:
    """Seconds per allreduce on this rank: warm up, then the best of 5 timed blocks (timing.py)."""
    return best_block(allreduce_once, iterations(nbytes), warmup_calls(nbytes), barrier=barrier)


# -- minidist ------------------------------------------------------------------------------------------
# column: (algorithm, in place, x a shared buffer: ``shared_empty``, in the cluster's shared memory)
MINIDIST = {"ring out=x": ("ring", True, False), "ring": ("ring", False, False),
            "auto out=x": ("auto", True, False), "shared_memory out=x": ("shared_memory", True, False),
            "shared_memory out=x, shared buffer": ("shared_memory", True, True),
            "ring out=x, shared buffer": ("ring", True, True)}


def _minidist_worker(comm, sizes, algorithm, in_place, shared_buffer=False):
    """(seconds per allreduce, CPU seconds per allreduce) on this rank at each size."""
    from minidist.collectives import allreduce, shared_empty

    times = []
    for nbytes in sizes:
        n = nbytes // 4
        x = shared_empty(comm, n, np.float32) if shared_buffer else np.empty(n, np.float32)
        x[...] = 0                                       # zeros: in place, the sums stay finite
        out = x if in_place else None
        once = lambda x=x, out=out: allreduce(comm, x, algorithm=algorithm, out=out)
        cpu = time.process_time()
        seconds = timed_loop(once, comm.barrier, nbytes)
        calls = warmup_calls(nbytes) + BLOCKS * iterations(nbytes)
        times.append((seconds, (time.process_time() - cpu) / calls))
    return times


def bench_minidist(world_size: int, sizes: list[int], algorithm: str, in_place: bool,
                   shared_buffer: bool = False, repeats: int = 1) -> tuple[list[float], list[float]]:
    """Seconds per allreduce at each size, the slowest rank's, best of ``repeats`` runs; and the CPU
    seconds one call costs the busiest rank (its average over all calls, the fewest of the runs)."""
    from minidist.cluster import run

    best, cpu = [float("inf")] * len(sizes), [float("inf")] * len(sizes)
    for _ in range(repeats):
        per_rank = run(_minidist_worker, world_size, sizes, algorithm, in_place, shared_buffer,
                       timeout=1200.0)
        best = [min(b, max(t for t, _ in ts)) for b, ts in zip(best, zip(*per_rank))]
        cpu = [min(c, max(c for _, c in ts)) for c, ts in zip(cpu, zip(*per_rank))]
    return best, cpu


def copy_bandwidth(nbytes: int = 32 << 20, count: int = 5) -> float:
    """One core's copy bandwidth in GB/s: bytes read + written per second by np.copyto of ``nbytes``,
    the best of 5 blocks of ``count`` copies (after warming up both arrays)."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    seconds = best_block(lambda: np.copyto(dst, src), count, warmup=count)
    return 2 * nbytes / seconds / 1e9


def _copy_worker(barrier, nbytes: int, count: int, results) -> None:
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    results.put(best_block(lambda: np.copyto(dst, src), count, warmup=count, barrier=barrier.wait))


def concurrent_copy_bandwidth(cores: int, nbytes: int = 32 << 20, count: int = 5) -> float:
    """Each core's copy bandwidth in GB/s (read + written) while ``cores`` processes copy at once: the
    memory bus they share, as the ranks of an allreduce share it (the slowest process's fastest block)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(cores), ctx.Queue()
    procs = [ctx.Process(target=_copy_worker, args=(barrier, nbytes, count, results)) for _ in range(cores)]
    for proc in procs:
        proc.start()
    seconds = max(results.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join()
    return 2 * nbytes / seconds / 1e9


def ring_ceiling(world_size: int, copy_gbs: float, concurrent_gbs: float) -> float:
    """busbw / copy bandwidth of an in-place ring whose ranks move their bytes at ``concurrent_gbs``, with
    no other cost: per rank it reads the incoming chunk, reads and writes its own (reduce-scatter), then
    reads one and writes one (allgather) — 5 (P − 1)/P · S bytes for 2 (P − 1)/P · S bus bytes, so
    busbw = 2/5 · concurrent bandwidth. (The concurrent bandwidth of a shared VM varies by 2× from run to
    run: read it beside the ring's own fraction in the same run.)"""
    return 0.4 * concurrent_gbs / copy_gbs if world_size > 1 else float("nan")


# -- MPICH through mpi4py -------------------------------------------------------------------------------
def mpi_worker(sizes: list[int]) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    times = []
    for nbytes in sizes:
        x = np.ones(nbytes // 4, dtype=np.float32)
        out = np.empty_like(x)
        once = lambda x=x, out=out: comm.Allreduce(x, out, op=MPI.SUM)
        times.append(timed_loop(once, comm.Barrier, nbytes))
    slowest = np.empty(len(times))
    comm.Reduce(np.array(times), slowest, op=MPI.MAX, root=0)
    if comm.rank == 0:
        print("RESULT " + json.dumps(slowest.tolist()))


def bench_mpi(world_size: int, sizes: list[int]) -> list[float] | None:
    command = mpi_worker_command(world_size, __file__, "--sizes", ",".join(map(str, sizes)))
    return None if command is None else _run_peer(command)


# -- torch.distributed, gloo backend --------------------------------------------------------------------
def gloo_worker(rank: int, world_size: int, port: int, sizes: list[int]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    times = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 4, dtype=torch.float32)
        times.append(timed_loop(lambda x=x: dist.all_reduce(x), dist.barrier, nbytes))
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        print("RESULT " + json.dumps(slowest.tolist()))
    dist.destroy_process_group()


def bench_gloo(world_size: int, sizes: list[int]) -> list[float] | None:
    size_arg = ",".join(map(str, sizes))
    return run_gloo_workers(world_size, lambda rank, port: [__file__, "--gloo-worker", str(rank),
                                                            str(world_size), str(port), "--sizes", size_arg])


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def _parse(output: str) -> list[float] | None:
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):]) if lines else None


def _run_peer(command: list[str]) -> list[float] | None:
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=1800, env=_env())
    if done.returncode != 0:
        print(f"peer failed: {' '.join(command[:4])} ...\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return _parse(done.stdout)


# -- report ---------------------------------------------------------------------------------------------
def human(nbytes: int) -> str:
    for unit in ("G", "M", "K"):
        if nbytes >= UNITS[unit]:
            return f"{nbytes // UNITS[unit]} {unit}iB"
    return f"{nbytes} B"


def busbw(nbytes: int, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth in GB/s."""
    return nbytes / seconds * 2 * (world_size - 1) / world_size / 1e9


def ratio(results: dict, a: str, b: str, i: int) -> str:
    """busbw of a over busbw of b at size i (= time of b over time of a)."""
    ok = results.get(a) and results.get(b) and results[a][i] and results[b][i]
    return f"{results[b][i] / results[a][i]:.2f}x" if ok else "-"


def step_overhead(nbytes: int, seconds: float, world_size: int, copy_gbs: float) -> float:
    """Seconds per ring step beyond the bytes: (t − 2 · busbytes / copy bandwidth) / (2 (P − 1))."""
    bus_bytes = 2 * (world_size - 1) / world_size * nbytes
    return (seconds - 2 * bus_bytes / (copy_gbs * 1e9)) / (2 * (world_size - 1))


def world_sizes(text: str, oversubscribe: bool) -> list[int]:
    """The world sizes asked for, less those above this machine's cores (unless oversubscribe)."""
    asked = [int(p) for p in text.split(",")]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    kept = [p for p in asked if p <= cores or oversubscribe]
    if kept != asked:
        print(f"skipping P = {[p for p in asked if p not in kept]}: more ranks than the {cores} cores "
              f"(--oversubscribe runs them anyway)")
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4K,1M,32M")
    parser.add_argument("--world-sizes", default="2,4,8")
    parser.add_argument("--oversubscribe", action="store_true", help="also run P above the core count")
    parser.add_argument("--repeats", type=int, default=1, help="minidist runs per column; the best is kept")
    parser.add_argument("--peers", default="mpich,gloo,floor", help="which peers to run beside minidist")
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gloo-worker", nargs=3, type=int, metavar=("RANK", "P", "PORT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.mpi_worker:
        return mpi_worker(sizes)
    if args.gloo_worker:
        return gloo_worker(*args.gloo_worker, sizes)

    import minidist

    print(f"machine: {os.cpu_count()} cores, {sys.platform}; python {sys.version.split()[0]}; "
          f"numpy {np.__version__}; load average {os.getloadavg()[0]:.1f}; minidist from "
          f"{Path(minidist.__file__).parent}")
    copy_gbs = copy_bandwidth()
    print(f"one core's copy bandwidth (32 MiB, read + written): {copy_gbs:.2f} GB/s")
    peers = args.peers.split(",")
    for world_size in world_sizes(args.world_sizes, args.oversubscribe):
        measured = {name: bench_minidist(world_size, sizes, algorithm, in_place, shared, args.repeats)
                    for name, (algorithm, in_place, shared) in MINIDIST.items()}
        results = {name: times for name, (times, _) in measured.items()}
        cpu = measured["ring out=x"][1]
        results |= {"mpich": bench_mpi(world_size, sizes) if "mpich" in peers else None,
                    "gloo": bench_gloo(world_size, sizes) if "gloo" in peers else None,
                    "floor": bench_floor(world_size, sizes) if "floor" in peers else None}
        ran = [name for name, times in results.items() if times is not None]
        shared_gbs = concurrent_copy_bandwidth(world_size)
        ceiling = ring_ceiling(world_size, copy_gbs, shared_gbs)
        print(f"\nP = {world_size} cores copying at once: {shared_gbs:.2f} GB/s each; an in-place ring "
              f"moving its bytes at that rate: busbw / copy bandwidth = {ceiling:.2f} (noisy on a shared VM)")
        print(f"P = {world_size}: busbw GB/s (time per allreduce in us) [busbw / copy bandwidth]")
        pairs = (("ring out=x", "mpich"), ("auto out=x", "mpich"), ("ring out=x", "gloo"))
        print("| size | " + " | ".join(ran) + " | " + " | ".join(f"{a} / {b}" for a, b in pairs)
              + " | ring out=x overhead per step (us) | ring out=x CPU per call (us) |")
        print("|---" * (len(ran) + len(pairs) + 3) + "|")
        for i, nbytes in enumerate(sizes):
            cells = [f"{busbw(nbytes, results[p][i], world_size):.2f} ({results[p][i] * 1e6:.0f}) "
                     f"[{busbw(nbytes, results[p][i], world_size) / copy_gbs:.2f}]"
                     if results[p][i] else "-" for p in ran]
            ratios = [ratio(results, a, b, i) for a, b in pairs]
            overhead = step_overhead(nbytes, results["ring out=x"][i], world_size, copy_gbs)
            print(f"| {human(nbytes)} | " + " | ".join(cells + ratios) + f" | {overhead * 1e6:.0f} | "
                  f"{cpu[i] * 1e6:.0f} |")


def bench_floor(world_size: int, sizes: list[int]) -> list[float | None] | None:
    """The bare-Python floor (floor.py) for the short arrays; None where it is not measured."""
    if world_size & (world_size - 1):
        return None
    return [floor_allreduce(world_size, nbytes) if nbytes <= FLOOR_MAX_BYTES else None for nbytes in sizes]


if __name__ == "__main__":
    main()
