"""Adam, AdamW, AMSGrad, RMSprop, Adagrad and LARS against updates computed by hand, plus their properties."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import Parameter
from minidist.optim import LARS, Adagrad, Adam, AdamW, RMSprop

adam_exercise = pytest.mark.exercise("adam")


def scalar_run(cls, grads, w0=1.0, **kwargs) -> list[float]:
    """w starts at w0; feed the given gradients one per step; return w after each step."""
    p = Parameter(np.array([w0]))
    opt = cls([p], **kwargs)
    out = []
    for g in grads:
        p.grad[...] = g
        opt.step()
        out.append(float(p.data[0]))
    return out


@adam_exercise
def test_adam_by_hand():
    # betas (0.5, 0.5). Step 1, g = 1: m̂ = g, v̂ = g², so the step is lr = 0.1 -> w1 = 0.9.
    # Step 2, g = 2: m = 0.25 + 1 = 1.25, m̂ = 1.25/0.75 = 5/3; v = 0.25 + 2 = 2.25, v̂ = 3.
    # Step = 0.1 · (5/3) / √3 -> w2 = 0.9 − 0.1·5/(3√3).
    got = scalar_run(Adam, [1.0, 2.0], lr=0.1, betas=(0.5, 0.5), eps=1e-12)
    assert got == pytest.approx([0.9, 0.9 - 0.5 / (3 * math.sqrt(3))], abs=1e-11)


@adam_exercise
def test_amsgrad_by_hand():
    # betas (0.5, 0.5), g = 2 then 0. Step 1: m = 1, v = 2 = v_max, m̂ = 2, v̂ = 4 -> w1 = 0.9.
    # Step 2: m = 0.5 (m̂ = 2/3), v = 1 but v_max stays 2 (v̂ = 8/3): step 0.1 · (2/3) / sqrt(8/3).
    # Plain Adam would divide by sqrt(4/3) instead: the larger step that AMSGrad forbids.
    ams = scalar_run(Adam, [2.0, 0.0], lr=0.1, betas=(0.5, 0.5), eps=1e-12, amsgrad=True)
    adam = scalar_run(Adam, [2.0, 0.0], lr=0.1, betas=(0.5, 0.5), eps=1e-12)
    assert ams == pytest.approx([0.9, 0.9 - 0.1 * (2 / 3) / math.sqrt(8 / 3)], abs=1e-11)
    assert adam == pytest.approx([0.9, 0.9 - 0.1 * (2 / 3) / math.sqrt(4 / 3)], abs=1e-11)


@adam_exercise
def test_adamw_by_hand():
    # Decoupled decay first: w = (1 − 0.1·0.1)·1 = 0.99, then Adam's first step of size lr: 0.89.
    # Adam with the same weight_decay adds 0.1·w to g instead; its first step is still lr: 0.9.
    assert scalar_run(AdamW, [1.0], lr=0.1, weight_decay=0.1, eps=1e-12) == pytest.approx([0.89], abs=1e-11)
    assert scalar_run(Adam, [1.0], lr=0.1, weight_decay=0.1, eps=1e-12) == pytest.approx([0.9], abs=1e-11)


def test_rmsprop_by_hand():
    # alpha 0.5, g = 2: v = 0.5·4 = 2, step 0.1·2/√2 = 0.1·√2.
    assert scalar_run(RMSprop, [2.0], lr=0.1, alpha=0.5, eps=1e-12) == pytest.approx([1 - 0.1 * math.sqrt(2)],
                                                                                   abs=1e-11)
    # centered: ḡ = 1, v − ḡ² = 1, step 0.1·2/1 = 0.2.
    assert scalar_run(RMSprop, [2.0], lr=0.1, alpha=0.5, eps=1e-12, centered=True) == pytest.approx([0.8],
                                                                                                abs=1e-11)
    # momentum 0.9: b1 = 2/√2 = √2; then g = 0: b2 = 0.9·√2, so w2 = w1 − 0.1·0.9·√2.
    w1, w2 = scalar_run(RMSprop, [2.0, 0.0], lr=0.1, alpha=0.5, eps=1e-12, momentum=0.9)
    assert (w1, w2) == pytest.approx((1 - 0.1 * math.sqrt(2), 1 - 0.19 * math.sqrt(2)), abs=1e-11)


def test_adagrad_by_hand():
    # sum starts at 1; g = 1: s = 2, w1 = 1 − 0.1/√2.  lr_decay 1: step 2 uses 0.1/(1 + 1) = 0.05, s = 3.
    got = scalar_run(Adagrad, [1.0, 1.0], lr=0.1, lr_decay=1.0, initial_accumulator_value=1.0, eps=1e-12)
    assert got == pytest.approx(
        [1 - 0.1 / math.sqrt(2), 1 - 0.1 / math.sqrt(2) - 0.05 / math.sqrt(3)], abs=1e-11
    )


def test_lars_by_hand():
    # |w| = |(3, 4)| = 5, |g| = |(0.6, 0.8)| = 1, η = 0.01: r = 0.05, step r·g = (0.03, 0.04).
    # With β = 0.1: r = 0.01·5 / (1 + 0.5) = 1/30 and g + βw = (0.9, 1.2): the same step (0.03, 0.04).
    for beta in (0.0, 0.1):
        p = Parameter(np.array([3.0, 4.0]))
        p.grad[...] = [0.6, 0.8]
        LARS([p], lr=1.0, momentum=0.0, weight_decay=beta, trust_coefficient=0.01).step()
        np.testing.assert_allclose(p.data, [2.97, 3.96], rtol=1e-14)
    # A zero layer has no scale to keep: r = 1, a plain SGD step.
    p = Parameter(np.zeros(2))
    p.grad[...] = [1.0, -1.0]
    LARS([p], lr=0.5, momentum=0.0).step()
    np.testing.assert_array_equal(p.data, [-0.5, 0.5])


@given(scale=st.floats(1e-6, 1e6), seed=st.integers(0, 2**16), lr=st.floats(0.01, 10))
def test_lars_step_is_a_fixed_fraction_of_the_layer_norm(scale, seed, lr):
    """μ = β = 0: |Δw| = γ·η·|w| whatever the gradient's scale (the point of the trust ratio)."""
    rng = np.random.default_rng(seed)
    w0 = rng.normal(size=(4, 5))
    p = Parameter(w0.copy())
    p.grad[...] = scale * rng.normal(size=(4, 5))
    LARS([p], lr=lr, momentum=0.0, trust_coefficient=0.02).step()
    assert np.linalg.norm(p.data - w0) == pytest.approx(lr * 0.02 * np.linalg.norm(w0), rel=1e-10)


@adam_exercise
@given(lr=st.floats(1e-4, 1.0), seed=st.integers(0, 2**16), log_scale=st.floats(-3, 3))
def test_adam_first_step_moves_each_coordinate_by_about_lr(lr, seed, log_scale):
    """m̂ = g and v̂ = g² at t = 1, so |Δw_i| = γ|g_i|/(|g_i| + ε): ≈ γ whatever the gradient's scale."""
    rng = np.random.default_rng(seed)
    w0 = rng.normal(size=50)
    g = rng.normal(size=50) * 10.0**log_scale
    p = Parameter(w0.copy())
    p.grad[...] = g
    Adam([p], lr=lr).step()
    step = p.data - w0
    expected = -lr * g / (np.abs(g) + 1e-8)
    np.testing.assert_allclose(step, expected, rtol=1e-9, atol=1e-15 + 1e-12 * lr)
    big = np.abs(g) > 1e-2
    assert np.all(np.abs(np.abs(step[big]) - lr) <= 1e-5 * lr)
    assert np.all(np.sign(step) == -np.sign(g))
