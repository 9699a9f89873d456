"""The simulated data stage: step time max(C, L/k) once every worker prefetches (q >= 1), C + L on demand."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.data.input_clock import simulate_input_pipeline


@given(compute=st.integers(1, 20), load=st.integers(0, 60), k=st.integers(1, 6), q=st.integers(1, 3))
def test_prefetching_step_time_is_max_of_compute_and_load_over_k(compute, load, k, q):
    # integer-valued seconds (scaled by 1/8): sums are exact, the steady state is reached exactly
    c, l_ = compute / 8, load / 8
    timeline = simulate_input_pipeline(12 * k + 20, c, l_, workers=k, prefetch=q)
    assert timeline.steady_step_time(last=6 * k) == pytest.approx(max(c, l_ / k), rel=1e-12)
    if l_ / k <= c:                            # workers keep up: no step waits once the pipeline is full
        assert np.all(timeline.stall[k * q + 1:] <= 1e-12)


@given(compute=st.integers(1, 20), load=st.integers(1, 60), k=st.integers(0, 6), q=st.integers(0, 3))
def test_on_demand_loading_stalls_every_step(compute, load, k, q):
    c, l_ = compute / 8, load / 8
    if k > 0 and q > 0:
        q = 0                                  # only q = 0, or loading in the loop (k = 0), is on demand
    timeline = simulate_input_pipeline(10, c, l_, workers=k, prefetch=q)
    np.testing.assert_allclose(np.diff(timeline.step_end), c + l_, rtol=1e-12)
    np.testing.assert_allclose(timeline.stall, l_, rtol=1e-12)       # the stall: the whole load, every step


def test_timeline_by_hand():
    # k = 2, q = 1, C = 1, L = 3: batches 0, 1 requested at 0, ready at 3; batch 2 asked when step 0
    # starts (3), ready at 6; steps run 3-4, 4-5 (batch 1 ready), then wait: 6-7, 7-8, 9-10, 10-11.
    t = simulate_input_pipeline(6, 1.0, 3.0, workers=2, prefetch=1)
    assert t.worker.tolist() == [0, 1, 0, 1, 0, 1]
    assert t.ready.tolist() == [3, 3, 6, 7, 9, 10]
    assert t.step_start.tolist() == [3, 4, 6, 7, 9, 10]
    assert t.stall.tolist() == [3, 0, 1, 0, 1, 0]       # 2 batches per 3 s: a step every 1.5 s
    assert t.steady_step_time(last=4) == 1.5 == max(1.0, 3.0 / 2)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="workers must be an integer >= 0"):
        simulate_input_pipeline(3, 1.0, 1.0, workers=-1, prefetch=1)
    with pytest.raises(ValueError, match="load must be a finite number >= 0"):
        simulate_input_pipeline(3, 1.0, float("nan"), workers=1, prefetch=1)
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        simulate_input_pipeline(0, 1.0, 1.0, workers=1, prefetch=1)


def test_steady_step_time_needs_a_window_inside_the_run():
    """0 used to give NaN, −1 a negative time, and last = steps an IndexError."""
    t = simulate_input_pipeline(5, 1.0, 0.5, workers=1, prefetch=1)
    assert t.steady_step_time(4) == 1.0
    for bad, match in ((0, "last must be an integer >= 1"), (-1, "last must be an integer >= 1"),
                       (2.5, "last must be an integer >= 1"), (5, r"1 <= last <= steps - 1 = 4")):
        with pytest.raises(ValueError, match=match):
            t.steady_step_time(bad)
