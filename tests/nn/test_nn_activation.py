"""ReLU, Tanh, Sigmoid, GELU, Dropout: gradient checks, torch comparisons, edge values, errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import GELU, Dropout, ReLU, Sigmoid, Tanh
from minidist.nn.gradcheck import gradcheck

from .nn_helpers import compare_with_torch

shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)
seeds = st.integers(0, 2**32 - 1)
ACTIVATIONS = {
    "ReLU": (ReLU, "ReLU", {}),
    "Tanh": (Tanh, "Tanh", {}),
    "Sigmoid": (Sigmoid, "Sigmoid", {}),
    "GELU": (GELU, "GELU", {}),
    "GELU-tanh": (GELU, "GELU", {"approximate": "tanh"}),
}


def away_from_zero(x):
    """ReLU's kink at 0: keep central differences (h = 1e-6) from straddling it."""
    return np.where(np.abs(x) < 1e-3, 0.5, x)


@pytest.mark.parametrize("name", ACTIVATIONS)
@given(shape=shapes, seed=seeds)
def test_activation_gradcheck(name, shape, seed):
    rng = np.random.default_rng(seed)
    layer_class, _, kwargs = ACTIVATIONS[name]
    x = away_from_zero(rng.uniform(-3, 3, shape))  # not deep in saturation, where every slope is ~0
    errors = gradcheck(layer_class(**kwargs), x, rng)
    assert errors["input"] < 1e-6, errors


@pytest.mark.parametrize("name", ACTIVATIONS)
@given(shape=shapes, seed=seeds)
def test_activation_matches_torch(name, shape, seed):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    layer_class, torch_name, kwargs = ACTIVATIONS[name]
    compare_with_torch(layer_class(**kwargs), getattr(torch.nn, torch_name)(**kwargs),
                       5 * rng.standard_normal(shape), rng)


def test_activations_keep_dtype_and_stay_finite_at_extremes():
    x = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0], dtype=np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no overflow hides in an exp
        for layer in (ReLU(), Tanh(), Sigmoid(), GELU(), GELU("tanh")):
            y = layer(x)
            dx = layer.backward(np.ones_like(x))
            assert y.dtype == np.float32 and dx.dtype == np.float32, layer
            assert np.isfinite(y).all() and np.isfinite(dx).all(), layer
    np.testing.assert_allclose(Sigmoid()(x), [0.0, np.exp(-50.0), 0.5, 1.0, 1.0], rtol=1e-6, atol=0)
    np.testing.assert_array_equal(GELU()(x)[[0, 2, 4]], [0.0, 0.0, 1000.0])


def test_relu_values():
    relu = ReLU()
    np.testing.assert_array_equal(relu(np.array([-2.0, 0.0, 3.0])), [0.0, 0.0, 3.0])
    np.testing.assert_array_equal(relu.backward(np.array([5.0, 5.0, 5.0])), [0.0, 0.0, 5.0])


def replay(layer, seed):
    return lambda: setattr(layer, "rng", np.random.default_rng(seed))


@given(shape=shapes, p=st.sampled_from([0.0, 0.2, 0.5, 0.9]), seed=seeds)
def test_dropout_gradcheck_with_fixed_mask(shape, p, seed):
    rng = np.random.default_rng(seed)
    layer = Dropout(p, rng=np.random.default_rng(seed))
    errors = gradcheck(layer, rng.standard_normal(shape), rng, before_forward=replay(layer, seed))
    assert errors["input"] < 1e-6, errors


def test_dropout_mask_scale_and_backward(rng):
    layer = Dropout(0.25, rng=np.random.default_rng(1))
    x = np.ones((200, 100), dtype=np.float32)
    y = layer(x)
    assert y.dtype == np.float32
    kept = y != 0
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)  # survivors are scaled by 1/(1 − p)
    assert abs(kept.mean() - 0.75) < 0.01                       # 20,000 Bernoulli(0.75): sd ≈ 0.003
    dy = rng.standard_normal(x.shape).astype(np.float32)
    np.testing.assert_array_equal(layer.backward(dy), np.where(kept, dy * np.float32(1 / 0.75), 0))
    # the same seed draws the same mask; another seed does not
    assert np.array_equal(Dropout(0.25, rng=np.random.default_rng(1))(x), y)
    assert not np.array_equal(Dropout(0.25, rng=np.random.default_rng(2))(x), y)


def test_dropout_eval_is_identity_and_edge_probabilities(rng):
    x = rng.standard_normal((4, 5))
    layer = Dropout(0.5, rng=rng).eval()
    assert layer(x) is x and layer.backward(x) is x
    assert np.array_equal(Dropout(0.0, rng=rng)(x), x)
    everything = Dropout(1.0, rng=rng)
    assert not everything(x).any() and not everything.backward(x).any()


def test_activation_flops():
    assert ReLU().flops((2, 3)) == 6
    assert Sigmoid().flops((2, 3)) == 18
    assert GELU().flops((10,)) == 50 and GELU("tanh").flops((10,)) == 90
    assert Dropout(0.5, rng=np.random.default_rng(0)).flops((4, 4)) == 16


def test_activation_errors():
    for layer in (ReLU(), Tanh(), Sigmoid(), GELU(), Dropout(0.1, rng=np.random.default_rng(0))):
        with pytest.raises(TypeError, match="float"):
            layer(np.arange(4))
        with pytest.raises(TypeError, match="numpy array"):
            layer([1.0, 2.0])
    with pytest.raises(ValueError, match="approximate"):
        GELU("erf")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Dropout(1.5)
    with pytest.raises(TypeError, match="Generator"):
        Dropout(0.5, rng=42)


@given(seed=seeds, scale=st.sampled_from([0.1, 1.0, 5.0, 100.0]))
def test_float32_gelu_fast_cdf_matches_the_float64_erf(seed, scale):
    """float32 GELU's Φ (Abramowitz & Stegun 7.1.26 in NumPy passes) against scipy's erf in float64:
    |ΔΦ| <= 3e-7, and forward/backward within a few float32 steps of the float64 layer's."""
    from minidist.nn.activation import normal_cdf

    x = scale * np.random.default_rng(seed).standard_normal(1000)
    exact = normal_cdf(x)  # float64: scipy's erf
    fast = normal_cdf(x.astype(np.float32))
    assert fast.dtype == np.float32 and np.abs(fast - exact).max() <= 3e-7
    assert normal_cdf(x.astype(np.float16)).dtype == np.float16
    dy = np.random.default_rng(seed + 1).standard_normal(1000)
    layer64, layer32 = GELU(), GELU()
    y64, y32 = layer64(x), layer32(x.astype(np.float32))
    np.testing.assert_allclose(y32, y64, rtol=1e-6, atol=4e-7 * scale)
    np.testing.assert_allclose(layer32.backward(dy.astype(np.float32)), layer64.backward(dy),
                               rtol=1e-5, atol=1e-6)
