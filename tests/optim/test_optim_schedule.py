"""Learning-rate schedules: values by hand, end points exact, monotone where they should be, bad arguments."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import Parameter
from minidist.optim import SGD
from minidist.optim.schedule import Constant, Cosine, LinearScalingRule, LinearWarmup, StepDecay, scaled_lr

lrs = st.floats(1e-5, 10.0)


def values(schedule, n):
    return np.array([schedule(k) for k in range(n)])


def test_values_by_hand():
    assert values(Constant(0.1), 3).tolist() == [0.1, 0.1, 0.1]
    assert values(StepDecay(1.0, step_size=2, gamma=0.5), 6).tolist() == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    cosine = Cosine(1.0, total_steps=4)
    assert values(cosine, 6) == pytest.approx(
        [1.0, (1 + math.sqrt(0.5)) / 2, 0.5, (1 - math.sqrt(0.5)) / 2, 0, 0]
    )
    warm = LinearWarmup(Constant(2.0), warmup_steps=4)
    assert values(warm, 6).tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.0]


def test_linear_scaling_rule_goyal():
    # 0.1 per 256 images -> 3.2 for 8192 (k = 32), warmed up from 0.1 in equal increments.
    assert scaled_lr(0.1, 8192, 256) == pytest.approx(3.2, rel=1e-15)
    rule = LinearScalingRule(0.1, batch_size=8192, base_batch_size=256, warmup_steps=5)
    lrs_ = values(rule, 8)
    assert lrs_[0] == pytest.approx(0.1, rel=1e-15)
    np.testing.assert_allclose(np.diff(lrs_[:6]), (3.2 - 0.1) / 5, rtol=1e-12)
    assert lrs_[5] == lrs_[7] == rule.peak_lr == scaled_lr(0.1, 8192, 256)
    assert LinearScalingRule(0.1, 128, 256)(0) == 0.05  # a smaller batch: the smaller rate at once


def test_a_schedule_drives_an_optimizer():
    p = Parameter(np.zeros(1))
    opt = SGD([p], lr=1.0)
    schedule = StepDecay(1.0, step_size=1, gamma=0.5)
    for step in range(3):
        opt.lr = schedule(step)
        p.grad[...] = -1.0  # each step moves w by +lr
        opt.step()
    assert p.data[0] == 1.0 + 0.5 + 0.25


@given(lr=lrs, min_fraction=st.floats(0, 1), total=st.integers(1, 10_000))
def test_cosine_hits_its_end_points_and_never_rises(lr, min_fraction, total):
    schedule = Cosine(lr, total, min_lr=lr * min_fraction)
    ks = np.unique(np.linspace(0, total + 3, 200).astype(int))
    got = np.array([schedule(int(k)) for k in ks])
    assert schedule(0) == lr and schedule(total) == schedule.min_lr and schedule(total + 5) == schedule.min_lr
    assert np.all(np.diff(got) <= 0)
    assert np.all((got >= schedule.min_lr) & (got <= lr))


@given(lr=lrs, gamma=st.floats(0.01, 1.0), step_size=st.integers(1, 50))
def test_step_decay_starts_at_lr_and_never_rises(lr, gamma, step_size):
    schedule = StepDecay(lr, step_size, gamma)
    got = values(schedule, 4 * step_size + 1)
    assert got[0] == lr and got[step_size - 1] == lr
    assert np.all(np.diff(got) <= 0)
    assert got[2 * step_size] == pytest.approx(lr * gamma**2, rel=1e-14)


@given(lr=lrs, warmup=st.integers(1, 500), start_factor=st.floats(0, 1))
def test_warmup_rises_to_its_end_point_exactly(lr, warmup, start_factor):
    schedule = LinearWarmup(Constant(lr), warmup, start_factor)
    got = values(schedule, warmup + 3)
    assert got[0] == lr * start_factor
    assert got[warmup] == lr and got[-1] == lr
    assert np.all(np.diff(got) >= 0)


@given(base=lrs, k=st.integers(1, 64), warmup=st.integers(0, 100))
def test_linear_scaling_rule_rises_from_base_to_k_times_base(base, k, warmup):
    rule = LinearScalingRule(base, batch_size=32 * k, base_batch_size=32, warmup_steps=warmup)
    got = values(rule, warmup + 2)
    assert got[0] == pytest.approx(base if warmup else k * base, rel=1e-14)
    assert got[warmup] == rule.peak_lr == scaled_lr(base, 32 * k, 32)
    assert np.all(np.diff(got) >= 0)


def test_warmup_composes_with_cosine():
    schedule = LinearWarmup(Cosine(1.0, total_steps=100), warmup_steps=10, start_factor=0.1)
    assert schedule(0) == pytest.approx(0.1)
    assert schedule(10) == Cosine(1.0, 100)(10)
    assert schedule(100) == 0.0


@pytest.mark.parametrize("make, allowed", [
    (lambda: Constant(-0.1), r"lr must be a finite number in \[0, inf\)"),
    (lambda: StepDecay(0.1, step_size=0), "step_size must be an integer >= 1"),
    (lambda: StepDecay(0.1, step_size=10, gamma=0.0), r"gamma .* \(0, 1\]"),
    (lambda: StepDecay(0.1, step_size=10, gamma=1.5), r"gamma .* \(0, 1\]"),
    (lambda: Cosine(0.1, total_steps=0), "total_steps must be an integer >= 1"),
    (lambda: Cosine(0.1, total_steps=10, min_lr=0.2), r"min_lr .* \[0, 0.1\]"),
    (lambda: LinearWarmup(Constant(0.1), warmup_steps=-1), "warmup_steps must be an integer >= 0"),
    (lambda: LinearWarmup(Constant(0.1), 10, start_factor=2.0), r"start_factor .* \[0, 1\]"),
    (lambda: scaled_lr(0.1, 0, 256), "batch_size must be an integer >= 1"),
    (lambda: LinearScalingRule(0.1, 512, base_batch_size=0), "base_batch_size must be an integer >= 1"),
    (lambda: Constant(0.1)(-1), "step must be an integer >= 0"),
])
def test_bad_arguments_say_what_is_allowed(make, allowed):
    with pytest.raises(ValueError, match=allowed):
        make()


def test_bad_types():
    with pytest.raises(TypeError, match="step must be an integer"):
        Constant(0.1)(1.5)
    with pytest.raises(TypeError, match="wraps a Schedule"):
        LinearWarmup(0.1, 10)
