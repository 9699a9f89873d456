"""The schedules beyond 1F1B as tables (tasks.py, interleaved.py, zero_bubble.py, chimera.py), checked
without running anything: every task once, dependencies, the papers' bubble fractions and activations.

    interleaved 1F1B  (P − 1) / (v·M + P − 1);  rank r holds min(v·M, 2(P − r − 1) + (v − 1)P + 1) chunks
    ZB-H1             (P − 1) / (3M + P − 1) for M ≥ P;  stage s holds P − s micro-batches from F to B
    Chimera           (D − 2) / (2N + D − 2);  rank r holds D/2 + 1 + min(r, D − 1 − r) when N = D
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.parallel.pipeline.chimera import (
    chimera_bubble,
    chimera_in_flight,
    chimera_rank,
    chimera_schedule,
)
from minidist.parallel.pipeline.interleaved import (
    interleaved_bubble,
    interleaved_in_flight,
    interleaved_orders,
    interleaved_schedule,
)
from minidist.parallel.pipeline.schedule import (
    bubble_fraction,
    check_tasks,
    max_in_flight,
    one_f_one_b_schedule,
    place_in_ticks,
    stage_ops,
)
from minidist.parallel.pipeline.tasks import Task, format_tasks
from minidist.parallel.pipeline.zero_bubble import zero_bubble_bubble, zero_bubble_schedule
from tests.parallel.interleaved_diagnosis import diagnose_interleaved


@pytest.mark.exercise("interleaved_orders")
@pytest.mark.diagnose
def test_every_rank_runs_megatrons_interleaved_order():
    wrong = diagnose_interleaved(interleaved_orders)
    assert wrong is None, wrong


@pytest.mark.exercise("interleaved_orders")
@given(P=st.integers(1, 5), groups=st.integers(1, 3), v=st.integers(1, 4))
def test_parallel_pipeline_interleaved_bubble_and_memory_are_megatrons(P, groups, v):
    M = groups * P
    schedule = interleaved_schedule(P, M, v)
    check_tasks(schedule, P, P * v, M)
    assert bubble_fraction(schedule, P) == pytest.approx(interleaved_bubble(P, M, v), abs=1e-12)
    assert len(schedule) == 2 * v * M + 2 * (P - 1)
    assert max_in_flight(schedule, P) == interleaved_in_flight(P, M, v)
    for r in range(P):  # rank r holds stages r, r + P, ...
        assert {t.stage for t in stage_ops(schedule, r)} == set(range(r, P * v, P))


@pytest.mark.exercise("interleaved_orders")
def test_parallel_pipeline_interleaved_orders_follow_megatron():
    orders = interleaved_orders(2, 2, 2)
    # rank 0: warm-up 2(P − 1) + (v − 1)P = 4 forwards: chunk 0 for micro-batches 0, 1, then chunk 1 (stage 2)
    assert orders[0][:4] == [Task(0, "F", 0, 0), Task(0, "F", 1, 0), Task(0, "F", 0, 2), Task(0, "F", 1, 2)]
    assert orders[0][4:6] == [Task(0, "B", 0, 2), Task(0, "B", 1, 2)]   # backwards start on the last chunk
    assert orders[1][:3] == [Task(1, "F", 0, 1), Task(1, "F", 1, 1), Task(1, "F", 0, 3)]
    assert orders[1][3] == Task(1, "B", 0, 3)


@pytest.mark.exercise("interleaved_orders")
def test_parallel_pipeline_interleaved_with_one_chunk_has_1f1bs_ticks():
    for P, M in ((1, 3), (2, 4), (4, 8)):   # v = 1 warms up with more forwards than 1F1B, same length
        one_f_one_b = one_f_one_b_schedule(P, M)
        assert len(interleaved_schedule(P, M, 1)) == len(one_f_one_b)
        assert bubble_fraction(interleaved_schedule(P, M, 1), P) == bubble_fraction(one_f_one_b, P)


def test_parallel_pipeline_interleaved_shrinks_the_bubble_by_v():
    assert interleaved_bubble(4, 8, 1) == pytest.approx(3 / 11)
    assert interleaved_bubble(4, 8, 4) == pytest.approx(3 / 35)
    with pytest.raises(ValueError, match="multiple of"):
        interleaved_schedule(4, 6, 2)
    with pytest.raises(ValueError, match="num_chunks"):
        interleaved_schedule(4, 8, 0)


@given(P=st.integers(1, 6), extra=st.integers(0, 8))
def test_parallel_pipeline_zero_bubble_h1(P, extra):
    M = P + extra
    schedule = zero_bubble_schedule(P, M)
    check_tasks(schedule, P, P, M)
    assert len(schedule) == 3 * M + P - 1
    assert bubble_fraction(schedule, P) == pytest.approx(zero_bubble_bubble(P, M), abs=1e-12)
    # 1F1B with a 2-tick backward idles 3(P − 1) ticks per stage; ZB-H1 idles P − 1: a third
    assert len(schedule) - 3 * M == (3 * (M + P - 1) - 3 * M) // 3
    assert max_in_flight(schedule, P, until="B") == [min(M, P - s) for s in range(P)]   # as 1F1B
    assert all(t.kind in "FBW" and t.rank == t.stage for tick in schedule for t in tick)


def test_parallel_pipeline_zero_bubble_w_fills_the_drain():
    schedule = zero_bubble_schedule(4, 6)
    last = stage_ops(schedule, 3)
    assert [t.kind for t in last[:6]] == ["F", "B", "F", "B", "F", "B"]   # the last stage defers its W's
    for r in range(4):
        assert [t.kind for t in stage_ops(schedule, r)].count("W") == 6


@given(half=st.integers(1, 4), groups=st.integers(1, 3))
def test_parallel_pipeline_chimera_bubble_and_memory_are_the_papers(half, groups):
    D = 2 * half
    N = groups * D
    schedule = chimera_schedule(D, N)
    check_tasks(schedule, D, D, N)
    assert bubble_fraction(schedule, D) == pytest.approx(chimera_bubble(D, N), abs=1e-12)
    assert len(schedule) == 2 * N + D - 2
    held = max_in_flight(schedule, D)
    assert max(held) <= D
    if N == D:
        assert held == chimera_in_flight(D)
        assert min(held) == D // 2 + 1
    for t in (t for tick in schedule for t in tick):   # each rank holds stages r and D − 1 − r only
        assert t.rank == chimera_rank(D, t.micro_batch, t.stage)
        assert t.stage in (t.rank, D - 1 - t.rank)


def test_parallel_pipeline_chimera_bad_sizes():
    with pytest.raises(ValueError, match="even"):
        chimera_schedule(3, 3)
    with pytest.raises(ValueError, match="multiple"):
        chimera_schedule(4, 6)


@pytest.mark.exercise("interleaved_orders")
def test_parallel_pipeline_tasks_check_catches_broken_tables():
    good = interleaved_schedule(2, 2, 2)
    check_tasks(good, 2, 4, 2)
    swapped = [list(tick) for tick in good]
    swapped[0], swapped[-1] = swapped[-1], swapped[0]
    with pytest.raises(ValueError, match="does not come after"):
        check_tasks(swapped, 2, 4, 2)
    with pytest.raises(ValueError, match="never runs"):
        check_tasks(good[:-1], 2, 4, 2)
    with pytest.raises(ValueError, match="two tasks"):
        check_tasks([[Task(0, "F", 0, 0), Task(0, "F", 1, 0)]], 1, 1, 2)
    with pytest.raises(ValueError, match="also runs on"):
        check_tasks([[Task(0, "F", 0, 0)], [Task(1, "B", 0, 0)]], 2, 1, 1)
    with pytest.raises(ValueError, match="deadlock"):
        place_in_ticks([[Task(0, "B", 0, 0), Task(0, "F", 0, 0)]], 1)
    text = format_tasks(good, 2)
    assert text.splitlines()[0].startswith("rank 0: F0.0 F1.0 F0.2")
