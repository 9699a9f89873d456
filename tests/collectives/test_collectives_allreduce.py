"""allreduce: every algorithm gives the exact reduction, bitwise the same on every rank.

hypothesis draws the world size (1-8) and a few cases (shape incl. 0-d, empty and lengths up to 5000 that
P does not divide, dtype, op); one cluster start-up runs all cases of an example.
"""

import numpy as np
import pytest
from hypothesis import given

from minidist.cluster import run
from minidist.collectives import ALGORITHMS, allreduce, choose_algorithm
from minidist.collectives.allreduce import MPICH_SHORT_MESSAGE_BYTES, SHORT_MESSAGE_BYTES
from tests.collectives.bitwise import mismatch
from tests.collectives.collectives_data import cases, exact, rank_arrays, world_sizes

OPS = ("sum", "sum", "mean", "max", "min")


def _allreduce_cases(comm, case_list, algorithms):
    results = []
    for seed, shape, dtype, op in case_list:
        x = rank_arrays(seed, comm.world_size, shape, dtype)[comm.rank]
        before = x.copy()
        for algorithm in algorithms:
            y = allreduce(comm, x, op=op, algorithm=algorithm)
            assert y is not x and np.array_equal(x, before), "allreduce must not modify its input"
            results.append(y)
    return results


def check_allreduce(world_size, case_list, algorithms):
    per_rank = run(_allreduce_cases, world_size, case_list, algorithms)
    i = 0
    for seed, shape, dtype, op in case_list:
        want = exact(rank_arrays(seed, world_size, shape, dtype), op)
        for algorithm in algorithms:
            for rank in range(world_size):
                got = per_rank[rank][i]
                wrong = mismatch(got, want, rank, world_size, algorithm)
                assert wrong is None, wrong
            i += 1


@pytest.mark.slow
@given(world_size=world_sizes, case_list=cases(OPS))
def test_allreduce_naive_doubling_rabenseifner_auto_exact(world_size, case_list):
    check_allreduce(world_size, case_list, ["naive", "recursive_doubling", "rabenseifner", "auto"])


@pytest.mark.exercise("ring_allreduce")
@pytest.mark.slow
@given(world_size=world_sizes, case_list=cases(OPS))
def test_ring_allreduce_exact(world_size, case_list):
    check_allreduce(world_size, case_list, ["ring"])


@pytest.mark.exercise("parameter_server_allreduce")
@pytest.mark.slow
@given(world_size=world_sizes, case_list=cases(OPS))
def test_parameter_server_allreduce_exact(world_size, case_list):
    check_allreduce(world_size, case_list, ["parameter_server"])


@pytest.mark.exercise("tree_allreduce")
@pytest.mark.slow
@given(world_size=world_sizes, case_list=cases(OPS))
def test_tree_allreduce_exact(world_size, case_list):
    check_allreduce(world_size, case_list, ["tree"])


def _integer_sum(comm):
    x = np.full(5, comm.rank + 1, dtype=np.int64)
    return [allreduce(comm, x, algorithm=a) for a in ("naive", "recursive_doubling", "rabenseifner")]


def test_allreduce_integer_arrays():
    for results in run(_integer_sum, 3):
        for y in results:
            assert y.dtype == np.int64 and np.array_equal(y, np.full(5, 6))


@pytest.mark.parametrize("world_size, nbytes, n, expected", [
    (4, 2048, 512, "recursive_doubling"),     # at MPICH's 2048-byte threshold: still short
    (4, 2052, 513, "rabenseifner"),
    (8, 1 << 20, 1 << 18, "rabenseifner"),
    (8, 4096, 4, "recursive_doubling"),       # fewer elements than P' = 8
    (6, 4096, 1024, "rabenseifner"),
])
def test_auto_follows_mpich_rule(world_size, nbytes, n, expected):
    assert choose_algorithm(nbytes, n, world_size, short_bytes=MPICH_SHORT_MESSAGE_BYTES) == expected


@pytest.mark.parametrize("world_size, nbytes, n, expected", [
    (4, 4096, 1024, "recursive_doubling"),     # short for minidist, long for MPICH's default
    (2, 512 * 1024, 131072, "recursive_doubling"),
    (2, 512 * 1024 + 4, 131073, "rabenseifner"),
    (8, 1 << 20, 4, "recursive_doubling"),     # fewer elements than P' = 8
])
def test_auto_uses_the_threshold_tuned_for_minidist(world_size, nbytes, n, expected):
    assert SHORT_MESSAGE_BYTES == 512 * 1024
    assert choose_algorithm(nbytes, n, world_size) == expected


def test_algorithm_names():
    assert set(ALGORITHMS) == {"naive", "parameter_server", "ring", "tree", "recursive_doubling",
                               "rabenseifner", "double_tree"}


@pytest.mark.parametrize("world_size", [2, 5])
def test_mean_divides_sum(world_size):
    def fn(comm):
        return allreduce(comm, np.full(3, float(comm.rank)), op="mean", algorithm="rabenseifner")
    for y in run(fn, world_size):
        assert np.array_equal(y, np.full(3, (world_size - 1) / 2))


def _on_sub_communicators(comm):
    group = comm.split(comm.rank % 2)  # ranks {0, 2, 4} and {1, 3}
    x = np.full(7, float(comm.rank))
    return [allreduce(group, x, algorithm=a) for a in ("naive", "recursive_doubling", "rabenseifner", "auto")]


def test_allreduce_on_sub_communicators():
    for rank, results in enumerate(run(_on_sub_communicators, 5)):
        members = [r for r in range(5) if r % 2 == rank % 2]
        for y in results:
            assert np.array_equal(y, np.full(7, float(sum(members))))


def _through_a_small_mailbox(comm, algorithm, n):
    rng = np.random.default_rng(comm.rank)
    x = rng.integers(-50, 50, size=(n, 3)).astype(np.float32).T      # transposed: not C-contiguous
    x.flags.writeable = False                                          # allreduce only reads x
    in_place = np.array(x, order="C")
    returned = allreduce(comm, in_place, algorithm=algorithm, out=in_place)
    assert returned is in_place
    return allreduce(comm, x, algorithm=algorithm), in_place, x


# (1000, 3) float32 = 12 KB: through a 4 KiB mailbox (slots of 256 bytes) these messages stream
@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "rabenseifner"])
@pytest.mark.parametrize("world_size, n", [(1, 4), (2, 5), (3, 7), (4, 1), (5, 100), (6, 1000)])
def test_streamed_messages_and_in_place_give_the_exact_sum(algorithm, world_size, n):
    results = run(_through_a_small_mailbox, world_size, algorithm, n, mailbox_bytes=4096)
    want = exact([x for *_, x in results], "sum")
    for rank, (fresh, in_place, _) in enumerate(results):
        assert (wrong := mismatch(fresh, want, rank, world_size, algorithm)) is None, wrong
        assert (wrong := mismatch(in_place, want, rank, world_size, f"{algorithm}, in place")) is None, wrong
        assert fresh.flags.c_contiguous


def _with_out(comm):
    x = np.arange(6, dtype=np.float64).reshape(2, 3) * (comm.rank + 1)
    before = x.copy()
    target = np.full_like(x, np.nan)
    into_target = allreduce(comm, x, op="mean", algorithm="tree", out=target)
    assert into_target is target and np.array_equal(x, before), "out= must leave x alone"
    in_place = allreduce(comm, x, algorithm="auto", out=x)
    assert in_place is x
    errors, shared = [], np.zeros(7)
    bad_pairs = [(x, np.empty((3, 2))), (x, np.empty((2, 3), np.float32)), (x, np.empty((3, 2)).T),
                 (x, x[:, :2]), (shared[:6].reshape(2, 3), shared[1:].reshape(2, 3)), (x, [0.0] * 6)]
    for source, bad in bad_pairs:
        try:
            allreduce(comm, source, out=bad)
            errors.append(None)
        except (TypeError, ValueError) as error:
            errors.append(type(error).__name__)
    return target, in_place, errors


@pytest.mark.parametrize("world_size", [1, 3])
def test_out_receives_the_result_and_may_be_x(world_size):
    p = world_size
    for target, in_place, errors in run(_with_out, p):
        x = np.arange(6, dtype=np.float64).reshape(2, 3)
        assert np.array_equal(target, x * (p + 1) / 2)
        assert np.array_equal(in_place, x * p * (p + 1) / 2)
        # wrong shape, wrong dtype, not contiguous, wrong shape, overlapping x, not an array
        assert errors == ["ValueError"] * 5 + ["TypeError"], errors
