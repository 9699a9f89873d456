"""SAG: equal to the direct formula w ← w − (γ/n) Σ_i y_i on least squares, linear convergence, errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import Parameter
from minidist.optim import SAG, SGD


def least_squares(n, d, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((n, d)), rng.standard_normal(n)
    return a, b, rng


def sample_grad(a, b, w, i):
    """∇ of f_i(w) = ½ (a_i·w − b_i)²."""
    return (a[i] @ w - b[i]) * a[i]


@given(n=st.integers(1, 12), d=st.integers(1, 5), steps=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_sag_equals_the_direct_formula(n, d, steps, seed):
    a, b, rng = least_squares(n, d, seed)
    w = Parameter(rng.standard_normal(d))
    w_direct = w.data.copy()
    stored = np.zeros((n, d))
    lr = 0.05
    optimizer = SAG([w], lr=lr, num_samples=n)
    for _ in range(steps):
        i = int(rng.integers(n))
        w.grad[...] = sample_grad(a, b, w.data, i)
        optimizer.step(i)
        stored[i] = sample_grad(a, b, w_direct, i)          # y_i = ∇f_i(w_k), the others as stored
        w_direct = w_direct - lr / n * stored.sum(axis=0)   # w_{k+1} = w_k − (γ/n) Σ_i y_i
        # d is updated incrementally (d − y_i + g), the direct form sums afresh: equal up to rounding
        np.testing.assert_allclose(w.data, w_direct, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(optimizer.state[0]["gradients"], stored, rtol=1e-10, atol=1e-12)


def test_sag_converges_linearly_where_sgd_stalls():
    n, d = 50, 5
    a, b, rng = least_squares(n, d, 7)
    w_star = np.linalg.lstsq(a, b, rcond=None)[0]
    loss = lambda w: 0.5 * np.mean((a @ w - b) ** 2)
    lipschitz = np.max(np.sum(a * a, axis=1))
    order = rng.integers(0, n, 60 * n)
    sag_w, sgd_w = Parameter(np.zeros(d)), Parameter(np.zeros(d))
    sag, sgd = SAG([sag_w], lr=1 / (3 * lipschitz), num_samples=n), SGD([sgd_w], lr=1 / (3 * lipschitz))
    for i in order:
        for p, opt in ((sag_w, sag), (sgd_w, sgd)):
            p.grad[...] = sample_grad(a, b, p.data, i)
            opt.step(int(i)) if opt is sag else opt.step()
    assert loss(sag_w.data) - loss(w_star) < 1e-12
    assert loss(sgd_w.data) - loss(w_star) > 1e-5


def test_state_dict_round_trip():
    a, b, rng = least_squares(6, 3, 1)
    w = Parameter(np.zeros(3))
    opt = SAG([w], lr=0.1, num_samples=6)
    for i in range(4):
        w.grad[...] = sample_grad(a, b, w.data, i)
        opt.step(i)
    saved, w_saved = opt.state_dict(), w.data.copy()
    w2 = Parameter(w_saved.copy())
    opt2 = SAG([w2], lr=0.5, num_samples=6)
    opt2.load_state_dict(saved)
    for i in (4, 5, 0):
        for p, o in ((w, opt), (w2, opt2)):
            p.grad[...] = sample_grad(a, b, p.data, i)
            o.step(i)
    assert w.data.tobytes() == w2.data.tobytes()
    bad = opt.state_dict()
    bad["state"][0]["gradients"] = np.zeros((5, 3))
    with pytest.raises(ValueError, match="gradients"):
        opt2.load_state_dict(bad)


def test_errors():
    w = Parameter(np.zeros(2))
    opt = SAG([w], lr=0.1, num_samples=3)
    for bad in (-1, 3, 10):
        with pytest.raises(ValueError, match=r"out of range \[0, 3\)"):
            opt.step(bad)
    with pytest.raises(TypeError, match="index"):
        opt.step()
    with pytest.raises(TypeError, match="int"):
        opt.step(1.0)
    assert opt.step_count == 0 and np.all(opt.state[0]["gradients"] == 0)
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="num_samples"):
            SAG([Parameter(np.zeros(2))], lr=0.1, num_samples=bad)
