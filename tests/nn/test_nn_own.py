"""Own tests of the nn exercises (linear, conv2d_backward, batchnorm_backward, cross_entropy_backward):
each test reaches one exercise region and no other (no Linear before a loss, no cross-entropy after a
layer). Gradients are checked by float64 central differences with random upstream gradients, and by the
property each backward pass must have.
"""

import numpy as np
import pytest

from minidist.nn import BatchNorm1d, BatchNorm2d, Conv2d, CrossEntropyLoss, Linear
from minidist.nn.gradcheck import gradcheck, gradcheck_loss

# -- linear ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 3), (5, 3), (2, 4, 3), (2, 1, 2, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gradcheck_any_leading_shape(shape, bias):
    rng = np.random.default_rng(len(shape) + bias)
    layer = Linear(3, 4, bias=bias, rng=rng, dtype=np.float64)
    errors = gradcheck(layer, rng.standard_normal(shape), rng)
    assert max(errors.values()) < 1e-6, errors


def test_linear_forward_is_x_wt_plus_b_and_backward_the_three_formulas():
    rng = np.random.default_rng(3)
    layer = Linear(4, 2, rng=rng, dtype=np.float64)
    x, dy = rng.standard_normal((6, 4)), rng.standard_normal((6, 2))
    w, b = layer.weight.data.copy(), layer.bias.data.copy()
    np.testing.assert_allclose(layer.forward(x), x @ w.T + b, rtol=1e-14)
    dx = layer.backward(dy)
    np.testing.assert_allclose(dx, dy @ w, rtol=1e-14)
    np.testing.assert_allclose(layer.weight.grad, dy.T @ x, rtol=1e-14)
    np.testing.assert_allclose(layer.bias.grad, dy.sum(axis=0), rtol=1e-14)


def test_linear_float32_stays_float32_and_gradients_add_up():
    rng = np.random.default_rng(4)
    layer = Linear(3, 2, rng=rng)
    x, dy = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32)
    assert layer.forward(x).dtype == np.float32
    dx = layer.backward(dy)
    assert dx.dtype == np.float32 and layer.weight.grad.dtype == np.float32
    once = layer.weight.grad.copy()
    layer.forward(x)
    layer.backward(dy)
    np.testing.assert_allclose(layer.weight.grad, 2 * once, rtol=1e-6)  # backward adds into .grad


# -- conv2d_backward -----------------------------------------------------------------------------------

CONV_CASES = [  # (N, C, O, kernel, stride, padding, H, W)
    (1, 1, 1, 1, 1, 0, 3, 3), (2, 2, 3, 3, 1, 1, 5, 4), (1, 3, 2, (2, 3), (2, 1), (1, 0), 6, 5),
    (2, 1, 2, 3, 3, 2, 4, 4), (1, 2, 1, (3, 1), 2, (0, 2), 5, 3),
]


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_backward_gradcheck(case, bias):
    n, c, o, kernel, stride, padding, h, w = case
    rng = np.random.default_rng(hash((case, bias)) % 2**32)
    layer = Conv2d(c, o, kernel, stride, padding, bias=bias, rng=rng, dtype=np.float64)
    errors = gradcheck(layer, rng.standard_normal((n, c, h, w)), rng)
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_input_gradient_is_the_adjoint_of_the_convolution(case):
    """Without bias a convolution is linear in x: <conv(x), dy> = <x, dx> for every x and dy, exactly
    the statement that backward applies the transposed convolution."""
    n, c, o, kernel, stride, padding, h, w = case
    rng = np.random.default_rng(7)
    layer = Conv2d(c, o, kernel, stride, padding, bias=False, rng=rng, dtype=np.float64)
    x = rng.standard_normal((n, c, h, w))
    y = layer.forward(x)
    dy = rng.standard_normal(y.shape)
    dx = layer.backward(dy)
    assert dx.shape == x.shape
    assert np.isclose(np.sum(y * dy), np.sum(x * dx), rtol=1e-12)
    assert np.isclose(np.sum(y * dy), np.sum(layer.weight.data * layer.weight.grad), rtol=1e-12)


def test_conv2d_bias_gradient_sums_dy_over_batch_and_space():
    rng = np.random.default_rng(8)
    layer = Conv2d(2, 3, 3, padding=1, rng=rng, dtype=np.float64)
    y = layer.forward(rng.standard_normal((2, 2, 4, 5)))
    dy = rng.standard_normal(y.shape)
    layer.backward(dy)
    np.testing.assert_allclose(layer.bias.grad, dy.sum(axis=(0, 2, 3)), rtol=1e-12)


# -- batchnorm_backward ----------------------------------------------------------------------------------

BN_SHAPES = [(BatchNorm1d, (4, 3)), (BatchNorm1d, (3, 2, 5)), (BatchNorm2d, (2, 3, 3, 4)),
             (BatchNorm2d, (1, 2, 4, 4))]


def randomised(layer_class, channels, rng):
    layer = layer_class(channels, dtype=np.float64)
    layer.weight.data[...] = rng.uniform(0.5, 2.0, channels)
    layer.bias.data[...] = rng.standard_normal(channels)
    return layer


@pytest.mark.parametrize("layer_class, shape", BN_SHAPES)
def test_batchnorm_backward_gradcheck_in_training_mode(layer_class, shape):
    rng = np.random.default_rng(shape)
    layer = randomised(layer_class, shape[1], rng)
    errors = gradcheck(layer, 3 * rng.standard_normal(shape) + 2, rng)
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.parametrize("layer_class, shape", BN_SHAPES)
def test_batchnorm_dx_sums_to_zero_per_channel_and_affine_gradients_by_formula(layer_class, shape):
    rng = np.random.default_rng(11)
    layer = randomised(layer_class, shape[1], rng)
    x = rng.standard_normal(shape)
    y = layer.forward(x)
    dy = rng.standard_normal(y.shape)
    dx = layer.backward(dy)
    axes = tuple(i for i in range(len(shape)) if i != 1)
    np.testing.assert_allclose(dx.sum(axis=axes), 0, atol=1e-12)
    shape1 = [1] * len(shape)
    shape1[1] = shape[1]
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    x_hat = (x - mean) / np.sqrt(var + layer.eps)
    np.testing.assert_allclose(layer.bias.grad, dy.sum(axis=axes), rtol=1e-12)
    np.testing.assert_allclose(layer.weight.grad, (dy * x_hat).sum(axis=axes), rtol=1e-10, atol=1e-12)


# -- cross_entropy_backward ------------------------------------------------------------------------------


@pytest.mark.parametrize("n, c", [(1, 1), (1, 4), (5, 3), (8, 10)])
def test_cross_entropy_backward_gradcheck(n, c):
    rng = np.random.default_rng(n * 100 + c)
    logits = 3 * rng.standard_normal((n, c))
    target = rng.integers(0, c, n)
    assert gradcheck_loss(CrossEntropyLoss(), logits, target) < 1e-6


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_gradient_is_softmax_minus_onehot_over_n(dtype):
    rng = np.random.default_rng(12)
    logits = (4 * rng.standard_normal((6, 5))).astype(dtype)
    target = rng.integers(0, 5, 6)
    loss = CrossEntropyLoss()
    loss.forward(logits, target)
    d = loss.backward()
    assert d.dtype == dtype and d.shape == logits.shape
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(6), target] -= 1
    np.testing.assert_allclose(d, p / 6, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-7)
    np.testing.assert_allclose(d.sum(axis=1), 0, atol=1e-6)   # a shift of a row's logits changes nothing


def test_cross_entropy_gradient_of_huge_logits_is_finite_and_exact():
    logits = np.array([[1000.0, 0.0, -1000.0], [0.0, 1000.0, 0.0]])
    loss = CrossEntropyLoss()
    loss.forward(logits, np.array([2, 1]))
    d = loss.backward()
    assert np.isfinite(d).all()
    np.testing.assert_allclose(d, [[0.5, 0, -0.5], [0, 0, 0]], atol=1e-12)
