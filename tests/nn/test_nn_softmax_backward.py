"""softmax_backward's two promises, checked without an oracle: its values (dx = y ⊙ (dy − Σ dy ⊙ y), the
Jacobian diag(y) − y·yᵀ times dy, row by row) and that it works along *every* axis, not only the last."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import nn
from minidist.nn.gradcheck import gradcheck

softmax_exercise = pytest.mark.exercise("softmax_backward")


def jacobian_times(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """(diag(y) − y·yᵀ)·dy along the last axis, with the Jacobian of every row formed explicitly."""
    n = y.shape[-1]
    jacobian = np.einsum("...i,ij->...ij", y, np.eye(n)) - np.einsum("...i,...j->...ij", y, y)
    return np.einsum("...ij,...j->...i", jacobian, dy)


@softmax_exercise
@given(rows=st.integers(1, 4), n=st.integers(1, 7), seed=st.integers(0, 2**16))
def test_every_row_is_its_jacobian_times_dy(rows, n, seed):
    rng = np.random.default_rng(seed)
    x, dy = 2 * rng.standard_normal((rows, 2, n)), rng.standard_normal((rows, 2, n))
    y = nn.softmax(x)
    dx = nn.softmax_backward(y, dy)
    assert dx.shape == y.shape
    np.testing.assert_allclose(dx, jacobian_times(y, dy), rtol=1e-12, atol=1e-15)


@softmax_exercise
def test_the_gradient_of_a_constant_shift_is_zero():
    """softmax(x + c) = softmax(x), so every row of dx sums to 0 (dy ⊥ the shift direction)."""
    rng = np.random.default_rng(3)
    y = nn.softmax(rng.standard_normal((5, 6)))
    dy = rng.standard_normal((5, 6))
    dx = nn.softmax_backward(y, dy)
    np.testing.assert_allclose(dx.sum(axis=-1), 0.0, atol=1e-15)
    np.testing.assert_allclose(nn.softmax_backward(y, dy + 7.0), dx, rtol=1e-12, atol=1e-15)
    assert np.abs(dx).max() > 1e-2                    # (a zero gradient would sum to 0 as well)


@softmax_exercise
@pytest.mark.promise("every axis")
@given(shape=st.lists(st.integers(2, 4), min_size=2, max_size=3).map(tuple), seed=st.integers(0, 2**16),
       data=st.data())
def test_along_any_axis_it_is_the_last_axis_moved_there(shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 2))    # never the last axis
    rng = np.random.default_rng(seed)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    y = nn.softmax(x, axis=axis)
    last = jacobian_times(np.moveaxis(y, axis, -1), np.moveaxis(dy, axis, -1))
    np.testing.assert_allclose(nn.softmax_backward(y, dy, axis=axis), np.moveaxis(last, -1, axis),
                               rtol=1e-12, atol=1e-15)


@softmax_exercise
@pytest.mark.promise("every axis")
@pytest.mark.parametrize("dim", [0, 1, -3])
def test_the_layer_along_a_leading_dim_matches_finite_differences(dim):
    rng = np.random.default_rng(dim + 10)
    x = 2 * rng.standard_normal((3, 4, 2))
    assert max(gradcheck(nn.Softmax(dim), x, rng).values()) < 1e-6
