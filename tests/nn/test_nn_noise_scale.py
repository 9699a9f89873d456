"""The gradient noise scale: per-example gradients equal finite differences of each example's loss, and
B_noise = tr(Σ)/|G|² predicts the error of a batch-B mean gradient, E|g_B − G|² = tr(Σ)/B."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.nn.gradcheck import numerical_gradient
from minidist.nn.noise_scale import gradient_noise_scale, per_example_gradients


def tiny(seed):
    rng = np.random.default_rng(seed)
    return Sequential(Linear(3, 4, rng=rng, dtype=np.float64), ReLU(),
                      Linear(4, 2, rng=rng, dtype=np.float64))


def test_each_row_is_that_examples_gradient_by_central_differences():
    model, loss = tiny(0), CrossEntropyLoss()
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(3, 3)), np.array([0, 1, 1])
    grads = per_example_gradients(model, loss, x, y)
    assert grads.shape == (3, sum(p.data.size for p in model.parameters())) and grads.dtype == np.float64
    for i in range(3):
        def example_loss(i=i):
            return loss.forward(model.forward(x[i:i + 1]), y[i:i + 1])
        numeric = np.concatenate([numerical_gradient(example_loss, p.data).ravel()
                                  for p in model.parameters()])
        assert np.allclose(grads[i], numeric, rtol=1e-6, atol=1e-8)


@settings(max_examples=20)
@given(n=st.integers(2, 12), d=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_noise_scale_is_the_trace_over_the_squared_mean(n, d, seed):
    grads = np.random.default_rng(seed).normal(size=(n, d)) + 0.5
    b_noise, mean = gradient_noise_scale(grads)
    trace = sum(np.sum((g - grads.mean(axis=0)) ** 2) for g in grads) / n
    assert np.allclose(mean, grads.mean(axis=0))
    assert np.isclose(b_noise, trace / np.sum(mean ** 2), rtol=1e-12)


def test_the_batch_error_falls_as_trace_over_b():
    rng = np.random.default_rng(2)
    grads = rng.normal(size=(400, 3)) + np.array([1.0, 0.0, 0.0])
    b_noise, mean = gradient_noise_scale(grads)
    trace = b_noise * (mean @ mean)
    for batch in (1, 4, 16):
        draws = rng.integers(0, len(grads), size=(4000, batch))
        error = np.mean([np.sum((grads[d].mean(axis=0) - mean) ** 2) for d in draws])
        assert abs(error * batch / trace - 1) < 0.1


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="shape"):
        gradient_noise_scale(np.ones(4))
    with pytest.raises(ValueError, match="zero"):
        gradient_noise_scale(np.array([[1.0], [-1.0]]))
    with pytest.raises(ValueError, match="same length"):
        per_example_gradients(tiny(0), CrossEntropyLoss(), np.ones((2, 3)), np.array([0]))
