"""Online Normalization (Chiley et al., NeurIPS 2019): gradient as the paper defines it, its properties,
and training at batch sizes 1 and 2 where BatchNorm cannot."""

import numpy as np
import pytest

from minidist.data import iterate_batches, load_digits
from minidist.nn import BatchNorm1d, CrossEntropyLoss, Linear, OnlineNorm, ReLU, Sequential
from minidist.nn.gradcheck import gradcheck, numerical_gradient, relative_error
from minidist.optim import SGD

BUFFERS = ("running_mean", "running_var", "u_ctrl", "v_ctrl")


def warmed_up(shape, alpha_bkw, rng, affine=True):
    """A layer whose statistics and error accumulators are non-trivial (a few training steps)."""
    layer = OnlineNorm(shape[1], alpha_fwd=0.8, alpha_bkw=alpha_bkw, affine=affine, dtype=np.float64)
    for _ in range(4):
        layer.forward(2.0 + 1.5 * rng.standard_normal(shape))
        layer.backward(rng.standard_normal(shape))
    if affine:
        layer.weight.data[...] = rng.uniform(0.5, 2.0, shape[1])
        layer.bias.data[...] = rng.standard_normal(shape[1])
        layer.zero_grad()
    return layer


def frozen(layer):
    """before_forward for gradcheck: every forward starts from the same state (the state is frozen)."""
    saved = {name: getattr(layer, name).copy() for name in BUFFERS}
    return lambda: [getattr(layer, name).__setitem__(Ellipsis, value) for name, value in saved.items()]


@pytest.mark.parametrize("shape", [(1, 4), (1, 3, 2, 3), (1, 2, 5)])
def test_online_norm_gradient_with_frozen_state_matches_finite_differences(shape):
    """Batch 1, αb = 1 (no corrections): the backward is exactly the gradient of the forward with the
    running statistics frozen, for x, γ and β."""
    rng = np.random.default_rng(len(shape))
    layer = warmed_up(shape, alpha_bkw=1.0, rng=rng)
    errors = gradcheck(layer, 2.0 + rng.standard_normal(shape), rng, before_forward=frozen(layer))
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 2, 2)])
def test_online_norm_corrections_are_the_frozen_gradient_minus_the_feedback(shape):
    """Any αb, any batch: dγ, dβ are the frozen finite differences; dx is g/s minus the two feedback
    terms, sample by sample, with the accumulators advanced as the paper's recurrences say."""
    rng = np.random.default_rng(1)
    layer = warmed_up(shape, alpha_bkw=0.7, rng=rng)
    x, dy = 1.0 + rng.standard_normal(shape), rng.standard_normal(shape)
    restore = frozen(layer)
    u, v = layer.u_ctrl.copy(), layer.v_ctrl.copy()
    restore()
    y = (layer.forward(x) - layer._per_channel(layer.bias.data, x.ndim)) / layer._per_channel(
        layer.weight.data, x.ndim
    )
    dx = layer.backward(dy)
    c, g = 0.3, dy * layer._per_channel(layer.weight.data, x.ndim)
    spatial = tuple(range(1, x.ndim - 1))
    for t in range(shape[0]):
        vt, ut = (a.reshape(-1, *[1] * (x.ndim - 2)) for a in (v, u))
        g_t = g[t] - c * vt * y[t]
        np.testing.assert_allclose(dx[t], g_t / layer._scales[t] - c * ut, rtol=1e-12, atol=1e-12)
        v = v + (g_t * y[t]).mean(axis=spatial) if spatial else v + g_t * y[t]
        u = u + dx[t].mean(axis=spatial) if spatial else u + dx[t]
    np.testing.assert_allclose(layer.u_ctrl, u, rtol=1e-12)
    np.testing.assert_allclose(layer.v_ctrl, v, rtol=1e-12)
    for p in (layer.weight, layer.bias):
        analytic = p.grad.copy()

        def loss():
            restore()
            return float(np.sum(dy * layer.forward(x)))

        assert relative_error(analytic, numerical_gradient(loss, p.data)) < 1e-6


def stream(layer, rng, steps, batch=1, features=3):
    """A stationary input N(3, 2²) and bounded upstream gradients; outputs, dx and the accumulators."""
    ys, dxs, us = [], [], []
    for _ in range(steps):
        y = layer.forward(3.0 + 2.0 * rng.standard_normal((batch, features)))
        dxs.append(layer.backward(rng.uniform(-1, 1, y.shape)))
        ys.append(y)
        us.append(np.abs(np.concatenate([layer.u_ctrl, layer.v_ctrl])).max())
    return np.concatenate(ys), np.concatenate(dxs), np.array(us)


def test_online_norm_output_is_asymptotically_zero_mean_unit_variance():
    """Property 1, on a stationary input of mean 3 and variance 4, batch size 1."""
    layer = OnlineNorm(3, alpha_fwd=0.99, alpha_bkw=0.99, affine=False, dtype=np.float64)
    y, _, _ = stream(layer, np.random.default_rng(0), 6000)
    late = y[3000:]
    assert np.abs(late.mean(axis=0)).max() < 0.1
    assert np.abs(late.var(axis=0) - 1).max() < 0.1
    np.testing.assert_allclose(layer.running_mean, 3.0, atol=0.5)
    np.testing.assert_allclose(layer.running_var, 4.0, rtol=0.3)


def test_online_norm_gradients_and_accumulated_errors_stay_bounded():
    """Properties 3 and 4: bounded |dy| gives bounded |dx|; ε⁽¹⁾, ε⁽ʸ⁾ stay bounded, so the long-run
    average of dx (Σ dx_t = ε⁽¹⁾_T − ε⁽¹⁾_0) goes to 0: dx is orthogonal to 1 in the long run."""
    layer = OnlineNorm(3, alpha_fwd=0.99, alpha_bkw=0.99, affine=False, dtype=np.float64)
    _, dx, errors = stream(layer, np.random.default_rng(1), 6000)
    assert np.isfinite(dx).all() and np.abs(dx).max() < 5.0          # |dy| ≤ 1, σ = 2
    assert errors[1000:].max() < 2 * errors[1000:3000].max() + 1.0    # no growth in the second half
    assert np.abs(dx.mean(axis=0)).max() < 0.01


def test_online_norm_bad_input_is_a_clear_error():
    for kwargs in ({"alpha_fwd": 1.0}, {"alpha_bkw": 1.5}, {"alpha_fwd": -0.1}, {"eps": 0.0}):
        with pytest.raises(ValueError, match="OnlineNorm needs|OnlineNorm: eps must be a finite number > 0"):
            OnlineNorm(3, **kwargs)
    layer = OnlineNorm(3, dtype=np.float64)
    for bad in (np.ones((2, 4)), np.ones(3), np.ones((0, 3))):
        with pytest.raises(ValueError, match="expected shape"):
            layer.forward(bad)
    assert layer.running_mean.sum() == 0 and layer.running_var.sum() == 3


DIGITS = load_digits(dtype=np.float64)


def digits_accuracy(norm, batch_size, samples=800):
    rng = np.random.default_rng(0)
    model = Sequential(Linear(64, 32, rng=rng, dtype=np.float64), norm(), ReLU(),
                       Linear(32, 10, rng=rng, dtype=np.float64))
    optimizer, loss_fn = SGD(model.parameters(), lr=0.05), CrossEntropyLoss()
    for idx in iterate_batches(samples, batch_size, np.random.default_rng(1)):
        optimizer.zero_grad()
        loss_fn.forward(model.forward(DIGITS.x_train[idx]), DIGITS.y_train[idx])
        model.backward(loss_fn.backward())
        optimizer.step()
    model.eval()
    return float((model.forward(DIGITS.x_test).argmax(axis=1) == DIGITS.y_test).mean())


def test_online_norm_trains_the_digits_at_batch_sizes_one_and_two():
    online = {b: digits_accuracy(lambda: OnlineNorm(32, 0.99, 0.99, dtype=np.float64), b) for b in (1, 2)}
    assert min(online.values()) > 0.7, online
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        digits_accuracy(lambda: BatchNorm1d(32, dtype=np.float64), 1)
    batch_norm_2 = digits_accuracy(lambda: BatchNorm1d(32, dtype=np.float64), 2)
    assert batch_norm_2 < online[2] - 0.05, (batch_norm_2, online)
