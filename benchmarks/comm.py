"""Point-to-point speed of minidist's shared-memory mailboxes against a raw Pipe and MPI, in one run.

    PYTHONPATH=. python benchmarks/comm.py            # add --quick for fewer repetitions

Measures, between ranks 0 and 1:
* one-way latency of a 64-byte message (half a ping-pong round trip; best batch of several),
* streaming bandwidth of a 64 MiB message (send, then a 1-byte acknowledgement; best of several),
with 2 ranks, and with 4 ranks on this 2-core machine (ranks 2 and 3 idle, blocked in a receive).
Peers: two ``multiprocess`` processes joined by a raw ``Pipe`` (send_bytes / recv_bytes_into), and, if
mpi4py is installed, MPI Send/Recv launched with mpiexec in a subprocess (same ranks, same pattern).
Prints the figures and the ratios minidist / peer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
from mpi_peer import mpi_worker_command  # benchmarks/mpi_peer.py, beside this script
from timing import best_block  # benchmarks/timing.py, beside this script

SMALL, LARGE = 64, 64 * 2**20


def pingpong(send, recv, rank: int, x: np.ndarray, reps: int, batches: int) -> float:
    """Best one-way time (seconds) over ``batches`` batches of ``reps`` round trips, seen from rank 0/1."""
    return best_block(lambda: round_trip(send, recv, rank, x, x), count=reps, blocks=batches) / 2


def stream(send, recv, rank: int, x: np.ndarray, ack: np.ndarray, reps: int) -> float:
    """Best time (seconds) to move ``x`` from rank 0 to rank 1, acknowledged by a 1-byte reply."""
    return best_block(lambda: round_trip(send, recv, rank, x, ack), count=1, blocks=reps)


def round_trip(send, recv, rank: int, there: np.ndarray, back: np.ndarray) -> None:
    """Rank 0 sends ``there`` to rank 1, which answers with ``back``."""
    if rank == 0:
        send(there)
        recv(back)
    else:
        recv(there)
        send(back)


def measure(send, recv, rank, reps, batches, streams):
    small, big, ack = np.zeros(SMALL, np.uint8), np.zeros(LARGE, np.uint8), np.zeros(1, np.uint8)
    latency = pingpong(send, recv, rank, small, reps, batches)
    seconds = stream(send, recv, rank, big, ack, streams)
    return {"latency_us": latency * 1e6, "bandwidth_GBps": LARGE / seconds / 1e9}


# -- minidist ------------------------------------------------------------------------------------------
def minidist_rank(comm, reps, batches, streams):
    if comm.rank >= 2:                       # idle ranks: blocked in a receive until the end
        comm.recv(0)
        return None
    other = 1 - comm.rank
    result = measure(lambda x: comm.send(x, other), lambda x: comm.recv(other, out=x), comm.rank, reps,
                     batches, streams)
    if comm.rank == 0:
        for idle in range(2, comm.world_size):
            comm.send(np.zeros(1), idle)
    return result


def minidist(world_size, reps, batches, streams):
    from minidist.cluster import run

    return run(minidist_rank, world_size, reps, batches, streams, timeout=600)[0]


# -- raw multiprocess Pipe -----------------------------------------------------------------------------
def pipe_rank(conn, rank, reps, batches, streams):
    return measure(lambda x: conn.send_bytes(x), lambda x: conn.recv_bytes_into(x), rank, reps, batches,
                   streams)


def pipe(reps, batches, streams):
    import multiprocess

    ctx = multiprocess.get_context("fork")
    a, b = ctx.Pipe()
    child = ctx.Process(target=pipe_rank, args=(b, 1, reps, batches, streams))
    child.start()
    result = pipe_rank(a, 0, reps, batches, streams)
    child.join()
    return result


# -- MPI (this file run under mpiexec with --mpi-worker) ----------------------------------------------
def mpi_worker(reps, batches, streams):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if rank >= 2:
        comm.Recv(np.zeros(1), source=0)
        return
    other = 1 - rank
    result = measure(lambda x: comm.Send(x, dest=other), lambda x: comm.Recv(x, source=other), rank, reps,
                     batches, streams)
    if rank == 0:
        for idle in range(2, comm.Get_size()):
            comm.Send(np.zeros(1), dest=idle)
        print(json.dumps(result), flush=True)


def mpi(world_size, reps, batches, streams):
    cmd = mpi_worker_command(world_size, __file__, "--reps", str(reps), "--batches", str(batches),
                             "--streams", str(streams))
    if cmd is None:
        return None
    try:
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {"latency_us": float("nan"), "bandwidth_GBps": float("nan"), "note": "timed out"}
    if done.returncode != 0:
        print("MPI failed:", done.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--streams", type=int, default=5)
    args = parser.parse_args()
    if args.mpi_worker:
        mpi_worker(args.reps, args.batches, args.streams)
        return
    if args.quick:
        args.reps, args.batches, args.streams = 300, 3, 3
    reps = (args.reps, args.batches, args.streams)
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"64 B one-way latency (best batch of {args.reps} round trips) and 64 MiB bandwidth")
    rows = {}
    for world_size in (2, 4):
        rows[f"minidist, {world_size} ranks"] = minidist(world_size, *reps)
        rows[f"MPI, {world_size} ranks"] = mpi(world_size, *reps)
    rows["multiprocess Pipe, 2 procs"] = pipe(*reps)
    print(f"{'':28s} {'latency (us)':>13s} {'bandwidth (GB/s)':>17s}")
    for name, row in rows.items():
        if row is None:
            print(f"{name:28s} {'(not available)':>31s}")
        else:
            print(f"{name:28s} {row['latency_us']:13.1f} {row['bandwidth_GBps']:17.2f}")
    for world_size in (2, 4):
        ours, peer = rows[f"minidist, {world_size} ranks"], rows[f"MPI, {world_size} ranks"]
        if peer is not None:
            print(f"{world_size} ranks: minidist/MPI latency {ours['latency_us'] / peer['latency_us']:.2f}x "
                  f"(target <= {5 if world_size == 2 else 1}x), bandwidth "
                  f"{ours['bandwidth_GBps'] / peer['bandwidth_GBps']:.2f}x (target >= 0.7x)")
    ours, peer = rows["minidist, 2 ranks"], rows["multiprocess Pipe, 2 procs"]
    print(f"2 ranks: minidist/Pipe latency {ours['latency_us'] / peer['latency_us']:.2f}x, "
          f"bandwidth {ours['bandwidth_GBps'] / peer['bandwidth_GBps']:.2f}x")


if __name__ == "__main__":
    main()
