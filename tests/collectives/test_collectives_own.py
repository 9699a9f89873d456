"""The own tests of the three allreduce exercises: ring_allreduce, parameter_server_allreduce and
tree_allreduce, each alone in its cluster run (a test that runs two of them counts for neither).

Integer-valued data makes every sum exact, so results are compared bitwise with the exact answer and
between ranks. Each algorithm's byte and message counts are the textbook's:
    ring              2(P−1) messages per rank; 2(P−1)/P·n elements per rank when P divides n,
                      2(P−1)·n summed over the ranks for any n
    parameter server  the root receives and sends (P−1)·n, every worker sends and receives n
    tree              a binomial tree: a rank sends n to its parent and n to each child (and receives
                      as much); 2(P−1)·n summed over the ranks
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.cluster import run
from minidist.collectives import allreduce
from minidist.sim.collective_cost import tree_children
from tests.collectives.bitwise import mismatch
from tests.own_helpers import integer_arrays

EXERCISES = {"ring": "ring_allreduce", "parameter_server": "parameter_server_allreduce",
             "tree": "tree_allreduce"}
OPS = ("sum", "max", "min", "mean")
LENGTHS = (1, 3, 7, 840, 1001)


def worker(comm, algorithm, cases):
    out = []
    for seed, n, dtype, op in cases:
        x = integer_arrays(seed, comm.world_size, n, dtype)[comm.rank]
        before = vars(comm.stats).copy()
        y = allreduce(comm, x, op=op, algorithm=algorithm)
        out.append((y, {k: v - before[k] for k, v in vars(comm.stats).items()}))
    return out


def exact(seed, world_size, n, dtype, op):
    stack = np.stack(integer_arrays(seed, world_size, n, np.float64))
    if op == "mean":
        return np.divide(stack.sum(axis=0).astype(dtype), world_size)
    return getattr(stack, op)(axis=0).astype(dtype)


def check_values(algorithm, world_size, cases):
    results = run(worker, world_size, algorithm, cases, timeout=60)
    for i, (seed, n, dtype, op) in enumerate(cases):
        want = exact(seed, world_size, n, dtype, op)
        for rank in range(world_size):
            got = results[rank][i][0]
            wrong = mismatch(got, want, rank, world_size, f"{algorithm} {op} n={n} {dtype}")
            assert wrong is None, wrong
    return results


def check_counts(algorithm, world_size, n, stats, itemsize):
    P = world_size
    sent = [s["bytes_sent"] for s in stats]
    received = [s["bytes_received"] for s in stats]
    assert sum(sent) == sum(received)
    if algorithm == "ring":
        assert sum(sent) == 2 * (P - 1) * n * itemsize
        if n % P == 0:
            assert sent == received == [2 * (P - 1) * n // P * itemsize] * P
            assert [s["messages_sent"] for s in stats] == [2 * (P - 1)] * P
    elif algorithm == "parameter_server":
        assert sent == received == [(P - 1) * n * itemsize] + [n * itemsize] * (P - 1)
        assert [s["messages_sent"] for s in stats] == [P - 1] + [1] * (P - 1)
    else:
        # reduce: a rank receives from each child and sends once to its parent; broadcast: the reverse
        assert sent == received == [(tree_children(r, P) + (r > 0)) * n * itemsize for r in range(P)]
        assert sum(sent) == 2 * (P - 1) * n * itemsize


def cases_for(world_size):
    return [(world_size * 100 + i, n, np.float64, OPS[i % len(OPS)]) for i, n in enumerate(LENGTHS)] + \
           [(7, 13, np.float32, "sum"), (8, 5, np.float16, "max")]


def params(exercise_algorithms=tuple(EXERCISES)):
    return [pytest.param(a, id=a) for a in exercise_algorithms]


@pytest.mark.parametrize("algorithm", params())
@pytest.mark.parametrize("world_size", [2, 3, 4, 5, 8])
def test_allreduce_exact_and_identical_on_every_rank(algorithm, world_size):
    check_values(algorithm, world_size, cases_for(world_size))


@pytest.mark.parametrize("algorithm", params())
@pytest.mark.parametrize("world_size", [2, 3, 4, 6])
@pytest.mark.promise("traffic")
def test_allreduce_moves_the_textbook_bytes(algorithm, world_size):
    cases = [(1, n, np.float64, "sum") for n in (world_size, 12 * world_size, 1001)]
    results = check_values(algorithm, world_size, cases)
    for i, (_, n, dtype, _) in enumerate(cases):
        check_counts(algorithm, world_size, n, [results[r][i][1] for r in range(world_size)],
                     np.dtype(dtype).itemsize)


@pytest.mark.parametrize("algorithm", params())
def test_allreduce_of_a_2d_float32_array_keeps_its_shape(algorithm):
    def shaped(comm):
        x = np.arange(12, dtype=np.float32).reshape(3, 4) * (comm.rank + 1)
        return allreduce(comm, x, algorithm=algorithm)
    for y in run(shaped, 3, timeout=60):
        assert y.shape == (3, 4) and y.dtype == np.float32
        np.testing.assert_array_equal(y, np.arange(12, dtype=np.float32).reshape(3, 4) * 6)


@pytest.mark.parametrize("algorithm", params())
@settings(max_examples=6)
@given(world_size=st.integers(2, 8), n=st.integers(1, 300), seed=st.integers(0, 2**16),
       op=st.sampled_from(OPS), dtype=st.sampled_from([np.float16, np.float32, np.float64]))
def test_allreduce_hypothesis(algorithm, world_size, n, seed, op, dtype):
    check_values(algorithm, world_size, [(seed, n, dtype, op)])
