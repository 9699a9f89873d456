"""The floor under minidist's small messages: the same exchanges in bare Python, no minidist code.

    PYTHONPATH=. python benchmarks/floor.py [--sizes 4K] [--world-sizes 2,4]

A short message in minidist costs Python statements, not hardware latency, so the fair yardstick is the
least Python that can do the same job between processes: here P processes (fork) joined by one
shared-memory slot per ordered pair and two semaphores per slot (``empty``, ``full``: a one-slot
bounded buffer, the textbook producer/consumer). A send waits for ``empty``, copies into the slot and
posts ``full``; a receive waits for ``full``, combines the slot into its array with NumPy and posts
``empty``. Waiting sleeps in sem_wait, as minidist's ranks sleep.

Measured, beside minidist in the same run:

- ``allreduce``: recursive doubling of a float32 array of S bytes (what minidist's ``auto`` runs for
  short arrays): copy x, then log2 P exchanges with the partner r XOR d, each adding the partner's array.
  Time per call: the slowest rank's average in its fastest of 5 blocks (as benchmarks/allreduce.py).
- ``latency``: one-way time of a 64-byte message between ranks 0 and 1 (half a round trip) while the
  other ranks wait, blocked (as benchmarks/comm.py's 4-rank latency).

Targets (issue 17): minidist <= 2x this floor. The ratio is printed as minidist / floor.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os

import numpy as np
from timing import best_block  # benchmarks/timing.py, beside this script


class Slot:
    """One ordered pair's mailbox: ``nbytes`` of shared memory and the empty/full semaphores."""

    def __init__(self, ctx, nbytes: int):
        self.memory = ctx.RawArray("b", max(nbytes, 1))
        self.empty, self.full = ctx.Semaphore(1), ctx.Semaphore(0)

    def send(self, x: np.ndarray) -> None:
        self.empty.acquire()
        np.frombuffer(self.memory, x.dtype, x.size)[...] = x
        self.full.release()

    def recv_add(self, out: np.ndarray) -> None:
        self.full.acquire()
        np.add(out, np.frombuffer(self.memory, out.dtype, out.size), out=out)
        self.empty.release()


def _run(target, world_size: int, *args) -> list[float]:
    """Start world_size forked processes running target(rank, world_size, *args, results); their results."""
    ctx = mp.get_context("fork")
    results = ctx.RawArray("d", world_size)
    procs = [ctx.Process(target=target, args=(r, world_size, *args, results)) for r in range(world_size)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    if any(proc.exitcode for proc in procs):
        raise RuntimeError("floor: a process failed")
    return list(results)


def _slots(world_size: int, nbytes: int) -> dict:
    ctx = mp.get_context("fork")
    return {(a, b): Slot(ctx, nbytes) for a in range(world_size) for b in range(world_size) if a != b}


def _allreduce_rank(rank, p, nbytes, slots, barrier, results):
    x = np.ones(nbytes // 4, np.float32)

    def once():
        out = x.copy()
        distance = 1
        while distance < p:
            partner = rank ^ distance
            slots[rank, partner].send(out)
            slots[partner, rank].recv_add(out)
            distance <<= 1
        return out

    results[rank] = best_block(once, count=200, warmup=2000, barrier=barrier.wait)


def floor_allreduce(world_size: int, nbytes: int) -> float:
    """Seconds per bare-Python recursive-doubling allreduce of nbytes (float32), world_size a power of 2."""
    barrier = mp.get_context("fork").Barrier(world_size)
    return max(_run(_allreduce_rank, world_size, nbytes, _slots(world_size, nbytes), barrier))


def _latency_rank(rank, p, slots, idle, results, reps=2000):
    x = np.zeros(16, np.float32)                       # 64 bytes
    if rank >= 2:                                      # blocked, like minidist's extra ranks in recv
        idle.acquire()
        return

    def round_trip():
        if rank == 0:
            slots[0, 1].send(x)
            slots[1, 0].recv_add(x)
        else:
            slots[0, 1].recv_add(x)
            slots[1, 0].send(x)

    results[rank] = best_block(round_trip, count=reps, warmup=reps) / 2
    if rank == 0:
        for _ in range(2, p):
            idle.release()


def floor_latency(world_size: int) -> float:
    """Seconds one way for 64 bytes between processes 0 and 1 while the others wait, blocked."""
    idle = mp.get_context("fork").Semaphore(0)
    return _run(_latency_rank, world_size, _slots(world_size, 64), idle)[0]


# -- minidist, the same two measurements ---------------------------------------------------------------
def _minidist_allreduce(comm, nbytes):
    from minidist.collectives import allreduce

    x = np.ones(nbytes // 4, np.float32)
    return best_block(lambda: allreduce(comm, x, algorithm="auto"), count=200, warmup=2000,
                      barrier=comm.barrier)


def minidist_allreduce(world_size: int, nbytes: int) -> float:
    from minidist.cluster import run

    return max(run(_minidist_allreduce, world_size, nbytes, timeout=600.0))


def _minidist_latency(comm, reps=2000):
    x = np.zeros(16, np.float32)
    if comm.rank >= 2:
        comm.recv(0)                                   # blocked until rank 0 is done
        return 0.0

    def round_trip():
        if comm.rank == 0:
            comm.send(x, 1)
            comm.recv(1, out=x)
        else:
            comm.recv(0, out=x)
            comm.send(x, 0)

    best = best_block(round_trip, count=reps, warmup=reps) / 2
    if comm.rank == 0:
        for other in range(2, comm.world_size):
            comm.send(x, other)
    return best


def minidist_latency(world_size: int) -> float:
    from minidist.cluster import run

    return run(_minidist_latency, world_size, timeout=600.0)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4K")
    parser.add_argument("--world-sizes", default="2,4")
    args = parser.parse_args()
    sizes = [int(s[:-1]) * 1024 if s.upper().endswith("K") else int(s) for s in args.sizes.split(",")]
    print(f"load average {os.getloadavg()[0]:.1f}; times in us (minidist / bare-Python floor)")
    print("| what | P | minidist | floor | ratio |\n|---|---|---|---|---|")
    for p in [int(w) for w in args.world_sizes.split(",")]:
        for nbytes in sizes:
            ours, floor = minidist_allreduce(p, nbytes), floor_allreduce(p, nbytes)
            print(f"| allreduce auto {nbytes} B | {p} | {ours * 1e6:.1f} | {floor * 1e6:.1f} | "
                  f"{ours / floor:.2f}x |")
        ours, floor = minidist_latency(p), floor_latency(p)
        print(f"| 64 B one-way latency | {p} | {ours * 1e6:.1f} | {floor * 1e6:.1f} | {ours / floor:.2f}x |")


if __name__ == "__main__":
    main()
