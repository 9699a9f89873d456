"""gpipe_schedule's own tests: the GPipe schedule as data, and a GPipe pipeline that reaches no other
exercise (Affine/Tanh stages, MSELoss, plain SGD; tests/own_helpers.py).

The property of the exercise: every F and B of P stages × M micro-batches runs once, each after what it
depends on, all forwards before any backward on a stage, in 2(M + P − 1) ticks (bubble (P−1)/(M+P−1));
and a pipeline run on that schedule computes what one process computes.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.cluster import run
from minidist.nn import MSELoss
from minidist.optim import SGD
from minidist.parallel import Pipeline, make_schedule
from tests.own_helpers import affine_model, regression_batches

FEATURES, STEPS = 4, 2


def ticks_of(schedule):
    return {(op.stage, op.kind, op.micro_batch): t for t, tick in enumerate(schedule) for op in tick}


@pytest.mark.parametrize("P", range(1, 7))
@pytest.mark.parametrize("M", [1, 2, 3, 5, 8])
def test_gpipe_schedule_runs_every_op_once_in_dependency_order(P, M):
    schedule = make_schedule("gpipe", P, M)
    ops = [(op.stage, op.kind, op.micro_batch) for tick in schedule for op in tick]
    assert sorted(ops) == sorted((s, k, m) for s in range(P) for m in range(M) for k in "FB")
    for t, tick in enumerate(schedule):
        assert len({op.stage for op in tick}) == len(tick), f"tick {t} gives a stage two ops"
    at = ticks_of(schedule)
    for s in range(P):
        for m in range(M):
            if s > 0:
                assert at[s, "F", m] > at[s - 1, "F", m]
            if s < P - 1:
                assert at[s, "B", m] > at[s + 1, "B", m]
            assert at[s, "B", m] > at[s, "F", m]
            assert at[s, "F", m] == s + m                               # the forward wave
            assert at[s, "B", m] == (M + P - 1) + (P - 1 - s) + m       # the wave reversed
        assert max(at[s, "F", m] for m in range(M)) < min(at[s, "B", m] for m in range(M))


@settings(max_examples=30)
@given(P=st.integers(1, 12), M=st.integers(1, 16))
def test_gpipe_ticks_bubble_and_memory(P, M):
    schedule = make_schedule("gpipe", P, M)
    assert len(schedule) == 2 * (M + P - 1)
    busy = sum(len(tick) for tick in schedule)
    assert busy == 2 * P * M
    idle = P * len(schedule) - busy
    assert idle * (M + P - 1) == (P - 1) * P * len(schedule)   # bubble fraction (P−1)/(M+P−1), exactly
    held, peak = [0] * P, [0] * P
    for tick in schedule:
        for op in tick:
            held[op.stage] += 1 if op.kind == "F" else -1
            peak[op.stage] = max(peak[op.stage], held[op.stage])
    assert peak == [M] * P   # GPipe holds every micro-batch's activations on every stage


def test_gpipe_schedule_ops_are_listed_by_stage_within_a_tick():
    for tick in make_schedule("gpipe", 4, 3):
        assert [op.stage for op in tick] == sorted(op.stage for op in tick)


def single_process(depth, seed, batches):
    model = affine_model(FEATURES, depth, seed)
    opt, loss_fn, out = SGD(model.parameters(), lr=0.1), MSELoss(), []
    for x, y in batches:
        model.zero_grad()
        pred = model.forward(x)
        loss = loss_fn.forward(pred, y)
        model.backward(loss_fn.backward())
        out.append((pred, loss, [p.grad.copy() for p in model.parameters()]))
        opt.step()
    return out, [p.data.copy() for p in model.parameters()]


def pipelined(comm, depth, seed, M, batches, checkpoint):
    model = affine_model(FEATURES, depth, seed)
    pipe = Pipeline(comm, model, loss_fn=MSELoss(), num_micro_batches=M, schedule="gpipe",
                    checkpoint=checkpoint)
    opt = SGD(pipe.parameters(), lr=0.1) if pipe.parameters() else None
    out = []
    for x, y in batches:
        loss = pipe.train_step(x, y, optimizer=None)
        out.append((pipe.output, loss, [p.grad.copy() for p in pipe.parameters()]))
        if opt is not None:
            opt.step()
    return out, [p.data.copy() for p in pipe.parameters()]


def check_pipeline(P, M, N, depth, seed=0, checkpoint=False):
    batches = regression_batches(seed, STEPS, N, FEATURES)
    want, want_params = single_process(depth, seed, batches)
    per_rank = run(pipelined, P, depth, seed, M, batches, checkpoint, timeout=120)
    for step, (pred, loss, grads) in enumerate(want):
        out, got_loss, _ = per_rank[-1][0][step]
        np.testing.assert_allclose(out, pred, rtol=1e-12, atol=1e-14, err_msg=f"step {step}: output")
        assert got_loss == pytest.approx(loss, rel=1e-12, abs=1e-15)
        got_grads = [g for rank in per_rank for g in rank[0][step][2]]
        assert len(got_grads) == len(grads)
        for i, (g, h) in enumerate(zip(got_grads, grads, strict=True)):
            np.testing.assert_allclose(g, h, rtol=1e-12, atol=1e-14, err_msg=f"step {step}: gradient {i}")
    got_params = [p for rank in per_rank for p in rank[1]]
    for i, (p, q) in enumerate(zip(got_params, want_params, strict=True)):
        np.testing.assert_allclose(p, q, rtol=1e-12, atol=1e-14, err_msg=f"parameter {i} after training")


@pytest.mark.parametrize("P, M, N, depth", [(1, 3, 6, 2), (2, 1, 5, 2), (2, 4, 9, 3), (3, 3, 7, 3),
                                            (4, 2, 8, 4)])
def test_gpipe_pipeline_trains_like_one_process(P, M, N, depth):
    check_pipeline(P, M, N, depth)


def test_gpipe_pipeline_with_checkpointing_trains_like_one_process():
    check_pipeline(3, 4, 8, 3, seed=5, checkpoint=True)
