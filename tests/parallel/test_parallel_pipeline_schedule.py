"""Pipeline schedules as data (minidist/parallel/pipeline/schedule.py), checked without running anything.

Every (stage, micro-batch) runs F once and B once; dependencies hold (F of s after F of s−1, B of s after
B of s+1 and after its own F); 1F1B holds at most P − s micro-batches at stage s; the bubble is
(P−1)/(M+P−1) for GPipe and 1F1B and (P−1)/P for the naive schedule.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.parallel.pipeline.registry import make_schedule
from minidist.parallel.pipeline.schedule import (
    SCHEDULES,
    Op,
    bubble_fraction,
    check_tasks,
    format_schedule,
    gpipe_schedule,
    max_in_flight,
    naive_schedule,
    one_f_one_b_schedule,
    place_in_ticks,
    stage_ops,
)
from tests.parallel.schedule_diagnosis import diagnose_gpipe

P_AND_M = {"num_stages": st.integers(1, 8), "num_micro_batches": st.integers(1, 16)}


def _tick_of(schedule):
    return {op: t for t, tick in enumerate(schedule) for op in tick}


@pytest.mark.exercise("gpipe_schedule")
@pytest.mark.diagnose
def test_every_gpipe_task_sits_at_its_wave_tick():
    wrong = diagnose_gpipe(gpipe_schedule)
    assert wrong is None, wrong


@pytest.mark.exercise("gpipe_schedule")
@given(**P_AND_M)
def test_parallel_pipeline_gpipe_schedule_is_the_textbook_wave(num_stages, num_micro_batches):
    P, M = num_stages, num_micro_batches
    schedule = gpipe_schedule(P, M)
    check_tasks(schedule, P, P, M)
    assert len(schedule) == 2 * (M + P - 1)
    tick_of = _tick_of(schedule)
    for s in range(P):
        assert [op.kind for op in stage_ops(schedule, s)] == ["F"] * M + ["B"] * M  # all F, then all B
        for m in range(M):
            assert tick_of[Op(s, "F", m)] == s + m
            assert tick_of[Op(s, "B", m)] == (M + P - 1) + (P - 1 - s) + m
    assert all(tick == sorted(tick) for tick in schedule)
    assert bubble_fraction(schedule, P) == pytest.approx((P - 1) / (M + P - 1), abs=1e-12)
    assert max_in_flight(schedule, P) == [M] * P  # GPipe's price: every micro-batch held at once
    assert gpipe_schedule(P, 1) == naive_schedule(P, 1)  # one micro-batch: nothing to overlap


@pytest.mark.exercise("gpipe_schedule")
def test_parallel_pipeline_gpipe_schedule_small_case_by_hand():
    assert gpipe_schedule(2, 2) == [
        [Op(0, "F", 0)], [Op(0, "F", 1), Op(1, "F", 0)], [Op(1, "F", 1)],
        [Op(1, "B", 0)], [Op(0, "B", 0), Op(1, "B", 1)], [Op(0, "B", 1)]]


@given(**P_AND_M)
def test_parallel_pipeline_1f1b_schedule_properties(num_stages, num_micro_batches):
    P, M = num_stages, num_micro_batches
    schedule = one_f_one_b_schedule(P, M)
    check_tasks(schedule, P, P, M)
    assert len(schedule) == 2 * (M + P - 1)  # the same length, hence the same bubble, as GPipe
    assert bubble_fraction(schedule, P) == pytest.approx((P - 1) / (M + P - 1), abs=1e-12)
    in_flight = max_in_flight(schedule, P)
    assert all(in_flight[s] <= P - s for s in range(P))
    assert in_flight == [min(P - s, M) for s in range(P)]
    for s in range(P):  # after the warm-up forwards, F and B alternate
        kinds = "".join(op.kind for op in stage_ops(schedule, s))
        warmup = min(P - s, M)
        assert kinds[:warmup] == "F" * warmup and "FF" not in kinds[warmup:]


@given(**P_AND_M)
def test_parallel_pipeline_naive_schedule_properties(num_stages, num_micro_batches):
    P, M = num_stages, num_micro_batches
    schedule = naive_schedule(P, M)
    check_tasks(schedule, P, P, M)
    assert all(len(tick) == 1 for tick in schedule)  # one stage busy at a time
    assert bubble_fraction(schedule, P) == pytest.approx((P - 1) / P, abs=1e-12)
    assert max_in_flight(schedule, P) == [1] * P


@pytest.mark.exercise("gpipe_schedule")
def test_parallel_pipeline_schedule_text_and_placement():
    text = format_schedule(gpipe_schedule(3, 2), 3)
    assert text.splitlines()[0].split()[2:] == ["F0", "F1", ".", ".", ".", ".", "B0", "B1"]
    assert text.splitlines()[2].split()[2:] == [".", ".", "F0", "F1", "B0", "B1", ".", "."]
    # place_in_ticks of GPipe's per-stage orders reproduces the explicit formula
    orders = [stage_ops(gpipe_schedule(4, 3), s) for s in range(4)]
    assert place_in_ticks(orders) == gpipe_schedule(4, 3)


def schedule_names():
    """The schedule names as pytest params; gpipe's reaches the gpipe_schedule exercise."""
    return [pytest.param(n, marks=pytest.mark.exercise("gpipe_schedule")) if n == "gpipe" else n
            for n in SCHEDULES]


@pytest.mark.parametrize("name", schedule_names())
def test_parallel_pipeline_schedule_checker_rejects_broken_schedules(name):
    good = make_schedule(name, 3, 2)
    check_tasks(good, 3, 3, 2)
    dropped = [[op for op in tick if op != Op(1, "B", 1)] for tick in good]
    with pytest.raises(ValueError, match="never runs"):
        check_tasks(dropped, 3, 3, 2)
    doubled = good + [[Op(0, "F", 0)]]
    with pytest.raises(ValueError, match="runs twice"):
        check_tasks(doubled, 3, 3, 2)
    swapped = [list(tick) for tick in good]  # move the last stage's F0 before the first stage's F0
    swapped[0].append(Op(2, "F", 0))
    swapped = [[op for op in tick if op != Op(2, "F", 0) or t == 0] for t, tick in enumerate(swapped)]
    with pytest.raises(ValueError, match="does not come after"):
        check_tasks(swapped, 3, 3, 2)
    with pytest.raises(ValueError, match="two tasks"):
        check_tasks([[Op(0, "F", 0), Op(0, "F", 1)]] + good, 3, 3, 2)
    with pytest.raises(ValueError, match="not a Task"):
        check_tasks([[Op(5, "F", 0)]], 3, 3, 2)
    with pytest.raises(ValueError, match="not a Task"):
        check_tasks([[Op(0, "X", 0)]], 3, 3, 2)


def test_parallel_pipeline_schedule_bad_sizes():
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        make_schedule("no-such-schedule", 2, 2)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="integer >= 1"):
            gpipe_schedule(bad, 2)
        with pytest.raises(ValueError, match="integer >= 1"):
            one_f_one_b_schedule(2, bad)
    with pytest.raises(ValueError, match="deadlock"):
        place_in_ticks([[Op(0, "B", 0), Op(0, "F", 0)]])
