"""Programs run on both backends by tests/cluster/test_cluster_mpi.py: the same ``fn`` under
``mpiexec -n P python tests/cluster/mpi_cases.py OUT P`` and on the simulated cluster must give bitwise
the same results, ``comm.stats``, clocks and spans.

Under mpiexec every process runs every case (each ``run_traced`` is one collective step of the job);
rank 0 pickles {case: (results, trace clocks, trace stats, trace spans)} into OUT.
"""

import pickle
import sys

import numpy as np

from minidist.cluster import run, run_traced
from minidist.collectives import (
    ALGORITHMS,
    allgather,
    allreduce,
    alltoall,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD, Adam
from minidist.parallel import DataParallel, Pipeline

SIZES = (0, 1, 3, 1001, 40_000)          # 40,000 float32: 160 KB, over the MPI backend's short limit
DTYPES = (np.bool_, np.float16, np.int8, np.uint64, np.float64, np.complex64, "<M8[s]", "<U3")


def data(rank: int, n: int, dtype=np.float32) -> np.ndarray:
    """Integer-valued data: every sum is exact."""
    return np.random.default_rng([rank, n]).integers(-50, 50, size=n).astype(dtype)


def point_to_point(comm):
    p, r, got = comm.world_size, comm.rank, []
    right, left = (r + 1) % p, (r - 1) % p
    for i, dtype in enumerate(DTYPES):
        for shape in ((), (0,), (2, 3), (5, 1, 4), (70_000,)):
            x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
            x = (x % 2).astype(dtype) if dtype is np.bool_ else (x % 100 + r).astype(dtype)
            got.append(comm.sendrecv(x, dst=right, src=left, sendtag=i, recvtag=i))
    out = np.zeros((20, 30), np.float32)[:, ::2]                 # not contiguous
    comm.send(data(r, 300, np.float32).reshape(20, 15), dst=right, tag=5)
    got.append(comm.recv(left, tag=5, out=out).copy())
    base = data(r + 9, 40_000, np.float64)
    acc = np.empty_like(base)
    comm.send(data(r, 40_000, np.float64), dst=right, tag=6)
    comm.send(data(r, 17, np.int32), dst=right, tag=7)
    got.append(comm.recv(left, tag=6, out=acc, op="sum", base=base).copy())
    got.append(comm.recv(left, tag=7, out=np.ones(17, np.int32), op="max"))
    comm.elapse(1e-4 * r)
    comm.barrier()
    return got, comm.stats, comm.clock


def collectives(comm):
    r, got = comm.rank, []
    for n in SIZES:
        x = data(r, n)
        for algorithm in ALGORITHMS:
            got.append(allreduce(comm, x, algorithm=algorithm))
        got.append(allreduce(comm, x.astype(np.int64), op="max", algorithm="ring"))
        got.append(allreduce(comm, x, op="mean", algorithm="tree"))
        got += [broadcast(comm, x, root=comm.world_size - 1), reduce(comm, x), gather(comm, x, root=0)]
        got += [scatter(comm, [data(j, n) for j in range(comm.world_size)] if r == 0 else None, root=0)]
        chunks = [data(r + j, n) for j in range(comm.world_size)]
        got += [allgather(comm, x), reduce_scatter(comm, x), alltoall(comm, chunks)]
    return got, comm.stats, comm.clock


def shared_memory_or_not(comm):
    """``auto`` and ``shared_memory`` give the same results on both backends, by different algorithms:
    the simulated cluster's ranks share memory (collectives/shared_memory.py), MPI's need not, and there
    both run message algorithms (RESULTS_ONLY: their stats, clocks and spans differ)."""
    return [allreduce(comm, data(comm.rank, n), algorithm=algorithm)
            for n in SIZES for algorithm in ("auto", "shared_memory")]


def groups(comm):
    sub = comm.split(comm.rank % 2, key=-comm.rank)
    none = comm.split(None if comm.rank == 0 else 1)
    got = [sub.rank, sub.world_size, allreduce(sub, data(comm.rank, 1001), algorithm="ring"),
           comm.all_equal(7), comm.all_equal(comm.rank), none is None]
    sub.barrier()
    comm.barrier()
    return got, comm.stats, sub.stats, comm.clock


def data_parallel(comm, optimizer):
    rng = np.random.default_rng(3)
    model = Sequential(Linear(6, 9, rng=rng, dtype=np.float64), ReLU(),
                       Linear(9, 4, rng=rng, dtype=np.float64))
    params = model.parameters()
    opt = SGD(params, lr=0.1, momentum=0.9) if optimizer == "sgd" else Adam(params, lr=0.01)
    dp = DataParallel(comm, model, opt, CrossEntropyLoss(), bucket_bytes=200)
    batches = np.random.default_rng(4)
    losses = [dp.train_step(batches.normal(size=(13, 6)), batches.integers(0, 4, size=13)) for _ in range(3)]
    return losses, [p.data for p in model.parameters()], comm.stats, comm.clock


def pipeline(comm):
    rng = np.random.default_rng(5)
    layers = []
    for _ in range(4):
        layers += [Linear(5, 5, rng=rng, dtype=np.float64), ReLU()]
    pipe = Pipeline(comm, Sequential(*layers), loss_fn=CrossEntropyLoss(), num_micro_batches=3)
    opt = SGD(pipe.parameters(), lr=0.1, momentum=0.9) if pipe.parameters() else None
    batches, losses = np.random.default_rng(6), []
    for _ in range(2):
        losses.append(pipe.train_step(batches.normal(size=(6, 5)), batches.integers(0, 5, size=6)))
        if opt is not None:
            opt.step()
            opt.zero_grad()
    return losses, [p.data for p in pipe.parameters()], comm.stats, comm.clock


CASES = {"point_to_point": (point_to_point, ()), "collectives": (collectives, ()),
         "shared_memory_or_not": (shared_memory_or_not, ()), "groups": (groups, ()),
         "data_parallel_sgd": (data_parallel, ("sgd",)), "data_parallel_adam": (data_parallel, ("adam",)),
         "pipeline": (pipeline, ())}


RESULTS_ONLY = {"shared_memory_or_not"}      # cases whose stats, clocks and spans may differ between backends


def mpi_only(comm):
    """What only the MPI backend has: algorithm="mpi" (MPI_Allreduce) equals the ring, bitwise."""
    x = data(comm.rank, 1001)
    return [np.array_equal(allreduce(comm, x, algorithm="mpi"), allreduce(comm, x, algorithm="ring")),
            np.array_equal(allreduce(comm, x, op="mean", algorithm="mpi"), allreduce(comm, x, op="mean"))]


def run_all(world_size: int) -> dict:
    """Every case on ``world_size`` ranks of the backend in use: {name: (results, clocks, stats, spans)}."""
    found = {}
    for name, (fn, args) in CASES.items():
        results, trace = run_traced(fn, world_size, *args, timeout=120)
        found[name] = (results, trace.clocks, trace.stats, trace.spans)
    return found


if __name__ == "__main__":
    out, world_size = sys.argv[1], int(sys.argv[2])
    found = run_all(world_size)
    found["mpi_only"] = run(mpi_only, world_size)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        with open(out, "wb") as f:
            pickle.dump(found, f)
