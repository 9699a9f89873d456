"""Hogwild! on shared memory: it learns; one process or a lock means no conflicts."""

import numpy as np
import pytest

from minidist.parallel.asynchronous import hogwild, sparse_problem
from minidist.parallel.asynchronous.hogwild import loss

PROBLEM = sparse_problem(600, 200, 5, np.random.default_rng(0))


def test_one_process_learns_without_conflicts():
    out = hogwild(PROBLEM, 1, 2, 0.5)
    assert out["conflicts"] == 0 and out["updates"] == 1200
    assert out["loss"] < 0.6 * loss(PROBLEM, np.zeros(PROBLEM.dim))


def test_one_process_is_reproducible():
    assert np.array_equal(hogwild(PROBLEM, 1, 1, 0.5, seed=3)["w"], hogwild(PROBLEM, 1, 1, 0.5, seed=3)["w"])


@pytest.mark.parametrize("lock", [False, True])
def test_two_processes_learn(lock):
    out = hogwild(PROBLEM, 2, 2, 0.5, lock=lock)
    assert out["loss"] < 0.6 * loss(PROBLEM, np.zeros(PROBLEM.dim))
    if lock:
        assert out["conflicts"] == 0


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="processes"):
        hogwild(PROBLEM, 0, 1, 0.5)
    with pytest.raises(ValueError, match="epochs"):
        hogwild(PROBLEM, 1, 0, 0.5)
    with pytest.raises(ValueError, match="nonzeros"):
        sparse_problem(10, 5, 6, np.random.default_rng(0))
