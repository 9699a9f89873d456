"""The collectives NCCL and the long-message literature use: double_tree allreduce, Van de Geijn's
broadcast, permute, and the bucket algorithm's ring-shifted GEMM — exact on integer data for 1-8 ranks,
with the ledger's bytes and messages equal to their closed forms."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.cluster import ClusterError, run
from minidist.collectives import allreduce, permute, ring_gemm, van_de_geijn_broadcast
from minidist.collectives.double_tree import binary_tree
from minidist.collectives.permute import check_permutation
from minidist.collectives.pieces import split_sizes


def _values(seed, p, n):
    return np.random.default_rng(seed).integers(-1000, 1000, size=(p, n), dtype=np.int64)


def _stats(comm):
    return comm.stats.bytes_sent, comm.stats.messages_sent


@given(p=st.integers(1, 200))
def test_every_rank_is_interior_in_at_most_one_tree(p):
    trees = [binary_tree(p, 0), binary_tree(p, 1)]
    for parent, children in trees:
        assert sum(q is None for q in parent) == 1 and all(len(c) <= 2 for c in children)
        below = sorted(c for kids in children for c in kids)
        assert below == [r for r in range(p) if parent[r] is not None]
        for r in range(p):                       # every rank reaches the root
            q, hops = r, 0
            while parent[q] is not None:
                q, hops = parent[q], hops + 1
                assert hops < p
    assert not any(trees[0][1][r] and trees[1][1][r] for r in range(p))


def _double_tree(comm, seed, n):
    x = _values(seed, comm.world_size, n)[comm.rank]
    before = _stats(comm)
    y = allreduce(comm, x, algorithm="double_tree")
    after = _stats(comm)
    return y, after[0] - before[0], after[1] - before[1]


@settings(max_examples=5)  # each example starts P processes
@given(p=st.integers(1, 8), n=st.integers(0, 50), seed=st.integers(0, 99))
def test_double_tree_is_exact_and_sends_its_closed_form(p, n, seed):
    results = run(_double_tree, p, seed, n)
    total = _values(seed, p, n).sum(axis=0)
    halves = split_sizes(n, 2)
    for r, (y, nbytes, messages) in enumerate(results):
        assert np.array_equal(y, total), r
        expected = [(parent[r] is not None) + len(children[r]) for parent, children
                    in (binary_tree(p, 0), binary_tree(p, 1))]
        assert messages == sum(expected) and nbytes == 8 * (expected[0] * halves[0] + expected[1] * halves[1])
    assert sum(m for _, _, m in results) == 4 * (p - 1)


def _broadcast(comm, seed, n, root):
    x = _values(seed, comm.world_size, n)[comm.rank]
    before = _stats(comm)
    y = van_de_geijn_broadcast(comm, x, root=root)
    after = _stats(comm)
    return y, after[0] - before[0], after[1] - before[1]


@settings(max_examples=5)
@given(p=st.integers(1, 8), chunks=st.integers(0, 6), seed=st.integers(0, 99), data=st.data())
def test_van_de_geijn_broadcast_is_exact_and_sends_2_p_minus_1_over_p_n(p, chunks, seed, data):
    root = data.draw(st.integers(0, p - 1))
    n = p * chunks                                       # P | n: the closed form holds exactly
    results = run(_broadcast, p, seed, n, root)
    share = 8 * (p - 1) * chunks
    for r, (y, nbytes, messages) in enumerate(results):
        assert np.array_equal(y, _values(seed, p, n)[root]), r
        assert (nbytes, messages) == ((2 * share, 2 * (p - 1)) if r == root else (share, p - 1)), r


def _permute(comm, perm):
    x = np.arange(comm.rank + 1, dtype=np.int32) * 10 + comm.rank   # a different length on every rank
    before = _stats(comm)
    y = permute(comm, x, perm)
    after = _stats(comm)
    return y, after[0] - before[0], after[1] - before[1]


@settings(max_examples=5)
@given(perm=st.integers(1, 8).flatmap(lambda p: st.permutations(range(p))))
def test_permute_sends_x_to_perm_r(perm):
    p = len(perm)
    results = run(_permute, p, perm)
    for r, (y, nbytes, messages) in enumerate(results):
        src = perm.index(r)
        assert np.array_equal(y, np.arange(src + 1, dtype=np.int32) * 10 + src), r
        assert (nbytes, messages) == ((0, 0) if perm[r] == r else (4 * (r + 1), 1)), r


def test_permute_of_the_lecture_swaps_neighbours():
    """The tutorial's table: x0 x1 x2 x3 -> x1 x0 x3 x2."""
    out = run(lambda comm: permute(comm, np.array([comm.rank]), [1, 0, 3, 2]), 4)
    assert [int(y[0]) for y in out] == [1, 0, 3, 2]


def test_permute_rejects_what_is_not_a_permutation():
    for bad in ([0, 0, 1], [0, 1], [0, 1, 3], "012", [0, 1.0, 2], [True, False, 2]):
        with pytest.raises(ValueError, match="perm"):
            check_permutation(bad, 3)
    with pytest.raises(ClusterError, match="perm"):
        run(lambda comm: permute(comm, np.zeros(2), [0, 0]), 2)


def _gemm(comm, a, b):
    p, r = comm.world_size, comm.rank
    before = _stats(comm)
    c = ring_gemm(comm, np.array_split(a, p)[r], np.array_split(b, p)[r])
    after = _stats(comm)
    return c, after[0] - before[0], after[1] - before[1]


@settings(max_examples=5)
@given(p=st.integers(1, 8), m=st.integers(0, 9), k=st.integers(0, 12), n=st.integers(0, 5),
       seed=st.integers(0, 99))
def test_ring_gemm_is_the_one_process_product(p, m, k, n, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.integers(-50, 50, (m, k)), rng.integers(-50, 50, (k, n))
    results = run(_gemm, p, a, b)
    assert np.array_equal(np.concatenate([c for c, _, _ in results]).reshape(m, n), a @ b)
    rows = split_sizes(k, p)
    for r, (_, nbytes, messages) in enumerate(results):   # every block but B_{r+1}'s passes through r
        assert messages == p - 1 and nbytes == 8 * n * (k - rows[(r + 1) % p]) * (p > 1), r


def test_ring_gemm_checks_the_block_of_b():
    with pytest.raises(ClusterError, match="b_rows"):
        run(lambda comm: ring_gemm(comm, np.ones((2, 4)), np.ones((3, 2))), 2)
