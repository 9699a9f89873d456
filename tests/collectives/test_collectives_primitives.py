"""broadcast, reduce, gather, scatter, allgather, reduce_scatter, alltoall, barrier: exact results on every
rank for world sizes 1-8, any root, shapes (0-d, empty, lengths not divisible by P) and float dtypes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.cluster import run
from minidist.collectives import (
    allgather,
    alltoall,
    barrier,
    broadcast,
    gather,
    pairwise_allreduce,
    reduce,
    reduce_scatter,
    scatter,
)
from tests.collectives.collectives_data import dtypes, exact, rank_arrays, seeds, shapes, world_sizes


def _chunk(seed, src, dst, dtype):
    """What rank src sends to rank dst in scatter/alltoall: a different length for every pair."""
    return np.full((src + 2 * dst) % 5, 10 * src + dst, dtype=dtype)


def _primitives(comm, seed, shape, dtype, root, op):
    p, r = comm.world_size, comm.rank
    x = rank_arrays(seed, p, shape, dtype)[r]
    before = x.copy()
    out = {
        "broadcast": broadcast(comm, x if r == root else None, root=root),
        "broadcast_out": broadcast(comm, x, root=root),  # non-roots pass an array of the right shape
        "reduce": reduce(comm, x, root=root, op=op),
        "gather": gather(comm, x, root=root),
        "scatter": scatter(comm, [_chunk(seed, root, j, dtype) for j in range(p)] if r == root else None,
                           root=root),
        "allgather": allgather(comm, x),
        "reduce_scatter": reduce_scatter(comm, x, op=op),
        "alltoall": alltoall(comm, [_chunk(seed, r, j, dtype) for j in range(p)]),
    }
    barrier(comm)
    assert np.array_equal(x, before), "collectives must not modify their input"
    return out


def same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.slow
@given(world_size=world_sizes, seed=seeds, shape=shapes, dtype=dtypes, root_fraction=st.floats(0, 0.99),
       op=st.sampled_from(["sum", "mean", "max", "min"]))
def test_primitives_exact_on_every_rank(world_size, seed, shape, dtype, root_fraction, op):
    root = int(root_fraction * world_size)
    xs = rank_arrays(seed, world_size, shape, dtype)
    total = exact(xs, op)
    pieces = np.array_split(total.ravel(), world_size)
    results = run(_primitives, world_size, seed, shape, dtype, root, op)
    for r, out in enumerate(results):
        assert same(out["broadcast"], xs[root]) and same(out["broadcast_out"], xs[root])
        if r == root:
            assert same(out["reduce"], total)
            assert len(out["gather"]) == world_size
            assert all(same(g, x) for g, x in zip(out["gather"], xs, strict=True))
        else:
            assert out["reduce"] is None and out["gather"] is None
        assert same(out["scatter"], _chunk(seed, root, r, dtype))
        assert len(out["allgather"]) == world_size
        assert all(same(g, x) for g, x in zip(out["allgather"], xs, strict=True))
        assert same(out["reduce_scatter"], pieces[r])
        assert all(same(out["alltoall"][j], _chunk(seed, j, r, dtype)) for j in range(world_size))


def _ledger_of_primitives(comm, n):
    x = np.ones(n, np.float32)
    counts = {}
    for name, call in [("broadcast", lambda: broadcast(comm, x)), ("reduce", lambda: reduce(comm, x)),
                       ("allgather", lambda: allgather(comm, x)),
                       ("reduce_scatter", lambda: reduce_scatter(comm, x))]:
        before = (comm.stats.bytes_sent, comm.stats.messages_sent)
        call()
        counts[name] = (comm.stats.bytes_sent - before[0], comm.stats.messages_sent - before[1])
    return counts


@pytest.mark.parametrize("world_size", [1, 3, 8])
def test_primitive_traffic_matches_formulas(world_size):
    """broadcast and reduce move (P − 1) messages of n in total; a ring allgather (P − 1)·n per rank;
    a ring reduce-scatter (P − 1)/P · n per rank."""
    p, n = world_size, 840  # 840 is divisible by 1..8
    nbytes = 4 * n
    results = run(_ledger_of_primitives, p, n)
    for name in ("broadcast", "reduce"):
        assert sum(c[name][0] for c in results) == (p - 1) * nbytes
        assert sum(c[name][1] for c in results) == p - 1
    for c in results:
        assert c["allgather"] == ((p - 1) * nbytes, p - 1)
        assert c["reduce_scatter"] == ((p - 1) * nbytes // p, p - 1)


def _pairwise(comm, n, op):
    x = (np.arange(n) % 7 + comm.rank).astype(np.int64).reshape(-1, 1)   # integers: sums are exact
    before = (comm.stats.bytes_sent, comm.stats.messages_sent)
    out = pairwise_allreduce(comm, x, op=op)
    return out, x, comm.stats.bytes_sent - before[0], comm.stats.messages_sent - before[1]


@settings(max_examples=10)
@given(world_size=st.integers(1, 8), n=st.integers(1, 40), op=st.sampled_from(["sum", "max", "min"]))
def test_pairwise_allreduce_is_the_allreduce_with_the_rings_bytes(world_size, n, op):
    """reduce_scatter then allgather: every rank holds the same reduction of x's shape, bitwise; each rank
    sends 2(P − 1) messages and all ranks together 2(P − 1)·n elements, the ring's counts for any n."""
    results = run(_pairwise, world_size, n, op)
    expected = getattr(np, op)(np.stack([x for _, x, _, _ in results]), axis=0)
    assert all(np.array_equal(out, expected) and out.dtype == np.int64 for out, _, _, _ in results)
    assert sum(b for _, _, b, _ in results) == 2 * (world_size - 1) * n * 8
    assert all(m == 2 * (world_size - 1) for _, _, _, m in results)
