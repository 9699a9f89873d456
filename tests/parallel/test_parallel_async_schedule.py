"""The stale-synchronous bound and the parameter-server schedule, without a cluster."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.parallel.asynchronous import check_bound, may_start, ps_schedule
from tests.parallel.staleness_diagnosis import diagnose_may_start


@pytest.mark.exercise("stale_synchronous_bound")
@pytest.mark.diagnose
def test_may_start_lets_a_worker_go_only_within_the_bound_of_the_slowest():
    wrong = diagnose_may_start(may_start)
    assert wrong is None, wrong


def test_may_start():
    assert may_start(0, [3, 1, 2], None)
    assert may_start(1, [3, 1, 2], 0)
    assert not may_start(0, [3, 1, 2], 1)
    assert may_start(0, [3, 1, 2], 2)
    assert not may_start(2, [3, 1, 2], 0) and may_start(2, [3, 1, 2], 1)


@given(workers=st.integers(1, 4), steps=st.integers(1, 5), servers=st.integers(1, 3),
       bound=st.one_of(st.none(), st.integers(0, 3)), seed=st.integers(0, 2**16))
def test_every_push_is_taken_once_in_arrival_order_within_the_bound(workers, steps, servers, bound, seed):
    seconds = np.random.default_rng(seed).exponential(1e-3, size=(workers, steps))
    sizes = [800 + 8 * j for j in range(servers)]
    plan = ps_schedule(seconds, sizes, sizes, 5e-6, 4e-11, bound)
    for pushes in plan.pushes:
        assert sorted((p.worker, p.step) for p in pushes) == [
            (w, k) for w in range(workers) for k in range(steps)
        ]
        received = [p.received for p in pushes]
        assert received == sorted(received)
        done = [0] * workers
        for p in pushes:
            done[p.worker] = p.step + 1
            for v in p.replies:         # a reply lets v start its step done[v]: at most `bound` ahead
                assert bound is None or done[v] - min(done) <= bound
            assert 0 <= p.staleness < workers * (steps if bound is None else bound + 1) or workers == 1
    assert plan.worker_clock.shape == (workers,)


def test_bound_zero_runs_in_rounds():
    plan = ps_schedule(np.array([[1.0, 1.0], [3.0, 3.0]]), [8], [8], 0.0, 0.0, bound=0)
    assert [(p.worker, p.step, p.staleness, p.replies) for p in plan.pushes[0]] == [
        (0, 0, 0, ()), (1, 0, 1, (0, 1)), (0, 1, 0, ()), (1, 1, 1, ())]
    assert plan.worker_clock.tolist() == [4.0, 6.0]


def test_bad_arguments():
    with pytest.raises(ValueError, match="staleness bound"):
        check_bound(-1)
    with pytest.raises(ValueError, match="staleness bound"):
        check_bound(1.5)
    with pytest.raises(ValueError, match="one entry per server"):
        ps_schedule(np.ones((2, 2)), [8], [8, 8], 0.0, 0.0)
    with pytest.raises(ValueError, match="seconds"):
        ps_schedule(np.ones(3), [8], [8], 0.0, 0.0)
