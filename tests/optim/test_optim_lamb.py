"""LAMB against the paper's equations computed by hand (bias correction, weight decay, trust ratio), and its
defining property: each layer moves by lr·|w| per step, whatever its gradient's scale."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import Parameter
from minidist.optim import LAMB
from minidist.optim.lamb import lamb_trust_ratio

lamb_exercise = pytest.mark.exercise("lamb_trust_ratio")


@lamb_exercise
def test_lamb_two_steps_by_hand():
    """x0 = (3, 4), λ = 0.1, betas (0.5, 0.5), η = 0.1, ε ≈ 0, gradients (0.6, 0.8) then (0.2, −0.4)."""
    p = Parameter(np.array([3.0, 4.0]))
    opt = LAMB([p], lr=0.1, betas=(0.5, 0.5), eps=1e-12, weight_decay=0.1)
    # Step 1: m̂ = g, v̂ = g², so r = g/|g| elementwise = (1, 1); u = r + λx0 = (1.3, 1.4);
    # trust ratio = |x0| / |u| = 5 / sqrt(1.69 + 1.96); x1 = x0 − 0.1 · ratio · u.
    p.grad[...] = [0.6, 0.8]
    opt.step()
    ratio1 = 5 / math.sqrt(3.65)
    x1 = np.array([3 - 0.1 * ratio1 * 1.3, 4 - 0.1 * ratio1 * 1.4])
    np.testing.assert_allclose(p.data, x1, rtol=1e-10)   # (ε = 1e-12 moves it by ~1e-12)
    assert opt.last_trust_ratios == pytest.approx([ratio1], rel=1e-10)
    # Step 2: m = 0.5·(0.3, 0.4) + 0.5·(0.2, −0.4) = (0.25, 0) ... written out:
    #   m = 0.5·m1 + 0.5·g2 with m1 = 0.5·g1 = (0.3, 0.4):  m = (0.25, 0.0),  m̂ = m / (1 − 0.25) = (1/3, 0)
    #   v = 0.5·v1 + 0.5·g2² with v1 = 0.5·g1² = (0.18, 0.32): v = (0.11, 0.24), v̂ = v / 0.75
    #   r = m̂ / sqrt(v̂) = ((1/3) / sqrt(0.11/0.75), 0);  u = r + 0.1·x1
    p.grad[...] = [0.2, -0.4]
    opt.step()
    r = np.array([(1 / 3) / math.sqrt(0.11 / 0.75), 0.0])
    u = r + 0.1 * x1
    ratio2 = np.linalg.norm(x1) / np.linalg.norm(u)
    np.testing.assert_allclose(p.data, x1 - 0.1 * ratio2 * u, rtol=1e-10)
    np.testing.assert_allclose(opt.state[0]["exp_avg"], [0.25, 0.0], atol=1e-15)
    np.testing.assert_allclose(opt.state[0]["exp_avg_sq"], [0.11, 0.24], rtol=1e-12)


@lamb_exercise
@pytest.mark.promise("layer step")
@given(scale=st.floats(1e-6, 1e6), seed=st.integers(0, 2**16), lr=st.floats(0.001, 0.5),
       decay=st.sampled_from([0.0, 0.01, 1.0]))
def test_every_layer_moves_by_lr_times_its_norm(scale, seed, lr, decay):
    rng = np.random.default_rng(seed)
    layers = [Parameter(rng.normal(size=(4, 5)) * 10.0), Parameter(rng.normal(size=5) * 0.01)]
    before = [p.data.copy() for p in layers]
    for i, p in enumerate(layers):
        p.grad[...] = scale * 10.0**(3 * i) * rng.normal(size=p.shape)   # gradients of very different scales
    LAMB(layers, lr=lr, weight_decay=decay).step()
    for p, w0 in zip(layers, before, strict=True):
        assert np.linalg.norm(p.data - w0) == pytest.approx(lr * np.linalg.norm(w0), rel=1e-9)


@lamb_exercise
def test_trust_ratio_edge_cases_and_cap():
    assert lamb_trust_ratio(np.array([3.0, 4.0]), np.array([0.0, 0.5])) == 10.0
    assert lamb_trust_ratio(np.zeros(3), np.ones(3)) == 1.0          # a zero layer: a plain Adam step
    assert lamb_trust_ratio(np.ones(3), np.zeros(3)) == 1.0
    p = Parameter(np.zeros(2))
    p.grad[...] = [1.0, -1.0]
    LAMB([p], lr=0.5, weight_decay=0.0, eps=1e-12).step()            # r = sign(g), ratio 1
    np.testing.assert_allclose(p.data, [-0.5, 0.5], rtol=1e-10)
    p = Parameter(np.array([3.0, 4.0]))
    p.grad[...] = [1.0, 0.0]
    opt = LAMB([p], lr=0.1, weight_decay=0.0, eps=1e-12, max_trust=2.0)
    opt.step()                                                        # ratio 5/1 capped at 2
    assert opt.last_trust_ratios == [2.0]
    np.testing.assert_allclose(p.data, [2.8, 4.0], rtol=1e-12)


def test_state_dict_round_trip_and_bad_arguments():
    """Stopped after 2 of 4 steps and resumed from state_dict(): bitwise the uninterrupted run."""
    rng = np.random.default_rng(0)
    grads = rng.normal(size=(4, 3))
    a, b = Parameter(rng.normal(size=3)), Parameter(np.zeros(3))
    b.data[...] = a.data
    opt_a, opt_b = LAMB([a], lr=0.01), LAMB([b], lr=0.01)
    for step, g in enumerate(grads):
        a.grad[...] = b.grad[...] = g
        opt_a.step()
        if step == 2:
            saved = opt_b.state_dict()
            opt_b = LAMB([b], lr=0.01)
            opt_b.load_state_dict(saved)
        opt_b.step()
    assert np.array_equal(a.data, b.data)
    with pytest.raises(ValueError, match=r"max_trust .* \(0, inf\)"):
        LAMB([a], max_trust=0.0)
    with pytest.raises(ValueError, match="betas"):
        LAMB([a], betas=(0.9,))
    with pytest.raises(ValueError, match="weight_decay"):
        LAMB([a], weight_decay=-1.0)
