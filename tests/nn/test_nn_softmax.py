"""Softmax: forward and the Jacobian-vector backward against torch (float64) and finite differences;
masked (−inf) entries; extreme logits; log_softmax."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import nn
from minidist.nn.gradcheck import gradcheck, numerical_gradient, relative_error

seeds = st.integers(0, 2**32 - 1)
shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)


@pytest.mark.exercise("softmax_backward")
@pytest.mark.promise("every axis")   # (its dims are drawn from all of them)
@given(shape=shapes, seed=seeds, data=st.data())
def test_softmax_matches_torch_and_finite_differences(shape, seed, data):
    torch = pytest.importorskip("torch")
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(seed)
    x = 3 * rng.standard_normal(shape)
    layer = nn.Softmax(dim)
    y = layer.forward(x)
    dy = rng.standard_normal(shape)
    dx = layer.backward(dy)
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.softmax(tx, dim)
    ty.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-10, atol=1e-14)
    assert max(gradcheck(nn.Softmax(dim), x, rng).values()) < 1e-6


@pytest.mark.exercise("softmax_backward")
def test_softmax_backward_is_the_jacobian_times_dy():
    """dx = (diag(y) − y yᵀ) dy, written out for one row."""
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal(6), rng.standard_normal(6)
    y = nn.softmax(x)
    jacobian = np.diag(y) - np.outer(y, y)
    np.testing.assert_allclose(nn.softmax_backward(y, dy), jacobian @ dy, rtol=1e-12, atol=1e-15)


@pytest.mark.exercise("softmax_backward")
def test_softmax_masked_entries_get_zero_probability_and_zero_gradient():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 4))
    x[np.triu_indices(4, 1)] = -np.inf  # a causal mask: row i sees columns 0..i
    layer = nn.Softmax()
    y = layer.forward(x)
    assert np.all(y[np.triu_indices(4, 1)] == 0) and np.allclose(y.sum(-1), 1)
    dx = layer.backward(rng.standard_normal((4, 4)))
    assert np.all(dx[np.triu_indices(4, 1)] == 0) and np.all(np.isfinite(dx))
    # the visible part's gradient is the softmax gradient of the visible entries alone
    row = 2
    sub = nn.Softmax()
    sub.forward(x[row, :row + 1])
    dy = rng.standard_normal((4, 4))
    np.testing.assert_allclose(layer.backward(dy)[row, :row + 1], sub.backward(dy[row, :row + 1]), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_softmax_and_log_softmax_of_extreme_logits_stay_finite(dtype):
    x = np.array([[1000.0, 999.0, -1000.0], [-5e4, -5e4, -5e4]], dtype=dtype)
    y = nn.softmax(x)
    assert y.dtype == dtype and np.all(np.isfinite(y)) and np.allclose(y.sum(-1), 1, atol=1e-3)
    log_y = nn.log_softmax(x.astype(np.float64))
    np.testing.assert_allclose(log_y[1], np.log(1 / 3), rtol=1e-12)
    assert log_y[0, 2] == pytest.approx(-2000 - np.log1p(np.exp(-1.0)), rel=1e-12)


def test_log_softmax_gradient_matches_differences():
    """The loss's stable log-softmax, checked through Σ g ⊙ log_softmax(x) (its derivative is g − y Σ g)."""
    rng = np.random.default_rng(2)
    x, g = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    analytic = g - nn.softmax(x) * g.sum(-1, keepdims=True)
    numeric = numerical_gradient(lambda: float(np.sum(g * nn.log_softmax(x))), x)
    assert relative_error(analytic, numeric) < 1e-7


def test_softmax_bad_input():
    with pytest.raises(TypeError, match="dim must be an int"):
        nn.Softmax(1.0)
    with pytest.raises(ValueError, match="out of range"):
        nn.Softmax(2).forward(np.zeros((2, 2)))
    with pytest.raises(TypeError, match="float"):
        nn.Softmax().forward(np.zeros((2, 2), np.int64))
