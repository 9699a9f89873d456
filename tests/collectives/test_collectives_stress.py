"""Hundreds of mixed collectives of random sizes in a row on 8 ranks: no deadlock, every result exact.

Every rank draws the same sequence of calls from one seed (as real programs do: the same code on every
rank); the data differ per rank. Each rank checks its own results against the exact answer.
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.collectives import ALGORITHMS, allgather, allreduce, alltoall, broadcast, reduce, reduce_scatter
from tests.collectives.collectives_data import exact, rank_arrays

KINDS = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall")


def _stress(comm, seed, count):
    p, r = comm.world_size, comm.rank
    plan = np.random.default_rng(seed)  # the same on every rank
    wrong = []
    for i in range(count):
        kind = KINDS[plan.integers(len(KINDS))]
        n = int(plan.choice([0, 1, 7, 64, 1000, 40_000]))  # 160 kB float32 arrays stream through mailboxes
        dtype = [np.float16, np.float32, np.float64][plan.integers(3)]
        root = int(plan.integers(p))
        xs = rank_arrays(int(plan.integers(2**32)), p, (n,), dtype)
        if kind == "allreduce":
            algorithm = [*ALGORITHMS, "auto"][plan.integers(len(ALGORITHMS) + 1)]
            ok = np.array_equal(allreduce(comm, xs[r], algorithm=algorithm), exact(xs, "sum"))
        elif kind == "broadcast":
            ok = np.array_equal(broadcast(comm, xs[r], root=root), xs[root])
        elif kind == "reduce":
            got = reduce(comm, xs[r], root=root)
            ok = got is None if r != root else np.array_equal(got, exact(xs, "sum"))
        elif kind == "allgather":
            ok = all(np.array_equal(a, b) for a, b in zip(allgather(comm, xs[r]), xs, strict=True))
        elif kind == "reduce_scatter":
            ok = np.array_equal(reduce_scatter(comm, xs[r]), np.array_split(exact(xs, "sum"), p)[r])
        else:
            got = alltoall(comm, [xs[r][j::p] for j in range(p)])
            ok = all(np.array_equal(got[j], xs[j][r::p]) for j in range(p))
        if not ok:
            wrong.append((i, kind))
    return wrong


@pytest.mark.slow
@pytest.mark.exercise("ring_allreduce")
@pytest.mark.exercise("parameter_server_allreduce")
@pytest.mark.exercise("tree_allreduce")
def test_hundreds_of_mixed_collectives_on_8_ranks():
    results = run(_stress, 8, 2024, 300, timeout=240.0)
    assert results == [[]] * 8
