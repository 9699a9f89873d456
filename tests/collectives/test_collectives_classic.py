"""Bruck's allgather, the pipelined chain broadcast and the dissemination barrier: exact results on every
rank for world sizes 1-8 (integer-valued data, compared bitwise), the messages and bytes of their formulas,
and the α-β clock equal to each closed form."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.cluster import Device, LinkModel, run
from minidist.collectives.bruck import bruck_allgather, bruck_allgather_time
from minidist.collectives.chain import best_segments, chain_broadcast, chain_broadcast_time
from minidist.collectives.dissemination import dissemination_barrier, dissemination_rounds
from tests.collectives.collectives_data import dtypes, rank_arrays, seeds, world_sizes

LINK = LinkModel(alpha=1e-6, beta=1e-9)


def _counted(comm, call):
    """Run call(); return (its result, messages sent, bytes sent, simulated seconds it took)."""
    sent, nbytes, start = comm.stats.messages_sent, comm.stats.bytes_sent, comm.clock
    out = call()
    return out, comm.stats.messages_sent - sent, comm.stats.bytes_sent - nbytes, comm.clock - start


def _bruck(comm, seed, shape, dtype):
    x = rank_arrays(seed, comm.world_size, shape, dtype)[comm.rank]
    before = x.copy()
    out = _counted(comm, lambda: bruck_allgather(comm, x))
    assert np.array_equal(x, before)                                     # x is not modified
    return out


@settings(max_examples=12, deadline=None)
@given(p=world_sizes, seed=seeds, shape=st.sampled_from([(0,), (1,), (5,), (3, 4), ()]), dtype=dtypes)
def test_bruck_allgather_gives_every_block_on_every_rank(p, seed, shape, dtype):
    results = run(_bruck, p, seed, shape, dtype, link=LINK)
    expected = rank_arrays(seed, p, shape, dtype)
    n = expected[0].nbytes
    for blocks, messages, nbytes, seconds in results:
        assert len(blocks) == p
        for got, want in zip(blocks, expected, strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
        assert messages == dissemination_rounds(p)                      # ⌈log2 P⌉, not P − 1
        assert nbytes == (p - 1) * n                                    # the pairwise allgather's bytes
        assert seconds == pytest.approx(bruck_allgather_time(p, n, LINK.alpha, LINK.beta), rel=1e-12)


def _chain(comm, seed, rows, root, segments):
    x = rank_arrays(seed, 1, (rows, 3), np.float64)[0] if comm.rank == root else None
    return _counted(comm, lambda: chain_broadcast(comm, x, root=root, segments=segments))


@settings(max_examples=12, deadline=None)
@given(p=world_sizes, seed=seeds, data=st.data())
def test_chain_broadcast_delivers_roots_array_and_takes_its_closed_form(p, seed, data):
    root = data.draw(st.integers(0, p - 1))
    segments = data.draw(st.integers(1, 6))
    rows = segments * data.draw(st.integers(0, 4))                     # equal segments: the closed form holds
    results = run(_chain, p, seed, rows, root, segments, link=LINK)
    want = rank_arrays(seed, 1, (rows, 3), np.float64)[0]
    n = want.nbytes
    for r, (got, messages, nbytes, _) in enumerate(results):
        assert got.shape == want.shape and got.tobytes() == want.tobytes()
        last = (r - root) % p == p - 1
        assert messages == (0 if last else segments) and nbytes == (0 if last else n)
    slowest = max(seconds for *_, seconds in results)
    assert slowest == pytest.approx(chain_broadcast_time(p, n, segments, LINK.alpha, LINK.beta), rel=1e-12)


def test_chain_broadcast_uneven_segments_and_refusals():
    def fn(comm):
        x = np.arange(10.0) if comm.rank == 0 else None
        return chain_broadcast(comm, x, segments=4)                    # 3, 3, 2, 2 rows
    assert all(np.array_equal(got, np.arange(10.0)) for got in run(fn, 3))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(Exception, match="segments must be an int"):
            run(lambda comm, s: chain_broadcast(comm, np.zeros(2), segments=s), 1, bad)
    with pytest.raises(Exception, match="at least one axis"):
        run(lambda comm: chain_broadcast(comm, np.array(1.0)), 1)


def test_chain_beats_the_tree_for_large_arrays_only():
    """A pipeline of P − 1 + S − 1 short steps against the tree's ⌈log2 P⌉ steps of n bytes: the tree wins
    small messages, the chain (at its best S) large ones — and its time tends to nβ."""
    p, alpha, beta = 8, 5e-6, 1 / 25e9
    tree = lambda n: dissemination_rounds(p) * (alpha + n * beta)
    for n, chain_wins in ((1_000, False), (100_000_000, True)):
        s = best_segments(p, n, alpha, beta)
        chain = chain_broadcast_time(p, n, s, alpha, beta)
        assert (chain < tree(n)) == chain_wins
        assert all(chain <= chain_broadcast_time(p, n, t, alpha, beta) for t in range(1, 2 * s + 2))
    big = 10**9
    assert chain_broadcast_time(p, big, best_segments(p, big, alpha, beta), alpha, beta) < 1.1 * big * beta


def _barrier(comm, work):
    comm.elapse(work[comm.rank])                                        # ranks arrive at different times
    arrived = comm.clock
    _, messages, nbytes, _ = _counted(comm, lambda: dissemination_barrier(comm))
    return arrived, comm.clock, messages, nbytes


@settings(max_examples=12, deadline=None)
@given(p=world_sizes, seed=seeds)
def test_dissemination_barrier_lets_nobody_leave_before_the_last_arrives(p, seed):
    work = list(np.random.default_rng(seed).uniform(0, 1e-3, size=p))
    results = run(_barrier, p, work, link=LINK)
    last_arrival = max(arrived for arrived, *_ in results)
    rounds = dissemination_rounds(p)
    for _, left, messages, nbytes in results:
        assert left >= last_arrival                                     # the barrier's promise, on the clock
        assert left <= last_arrival + rounds * LINK.alpha + 1e-15       # and no more than its ⌈log2 P⌉·α
        assert messages == rounds and nbytes == 0


def test_dissemination_barrier_holds_in_real_time():
    """In wall-clock terms too: a rank that sleeps before the barrier keeps the others in it."""
    import time

    def fn(comm):
        if comm.rank == 2:
            time.sleep(0.3)
        start = time.monotonic()
        dissemination_barrier(comm)
        return time.monotonic() - start
    waited = run(fn, 4, device=Device())
    assert all(w > 0.15 for r, w in enumerate(waited) if r != 2)
