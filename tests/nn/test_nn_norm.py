"""BatchNorm1d/2d, LayerNorm, GroupNorm: gradient checks (random γ, β and upstream gradients), torch
comparisons of outputs, gradients and running statistics, eval mode, errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm
from minidist.nn.gradcheck import gradcheck

from .nn_helpers import compare_with_torch

seeds = st.integers(0, 2**32 - 1)


def randomise_affine(layer, rng):
    """γ, β away from (1, 0), so that a wrong use of either cannot hide."""
    for p in layer.parameters():
        p.data[...] = rng.standard_normal(p.shape)
    return layer


@st.composite
def batchnorm_case(draw):
    """(layer class, input shape) for BatchNorm1d on (N, C) / (N, C, L) and BatchNorm2d on (N, C, H, W).

    Each statistic covers at least 3 values: with 2, x̂ = ±1 whatever x is, the gradient is ~ε and the
    check would only measure rounding noise."""
    kind = draw(st.sampled_from(["1d", "1d-seq", "2d"]))
    c = draw(st.integers(1, 3))
    if kind == "1d":
        return BatchNorm1d, (draw(st.integers(3, 5)), c)
    if kind == "1d-seq":
        return BatchNorm1d, (draw(st.integers(2, 4)), c, draw(st.integers(2, 4)))
    return BatchNorm2d, (draw(st.integers(1, 3)), c, draw(st.integers(1, 3)), draw(st.integers(3, 4)))


@pytest.mark.exercise("batchnorm_backward")
@given(case=batchnorm_case(), training=st.booleans(), affine=st.booleans(), seed=seeds)
def test_batchnorm_gradcheck(case, training, affine, seed):
    layer_class, shape = case
    rng = np.random.default_rng(seed)
    layer = randomise_affine(layer_class(shape[1], affine=affine, dtype=np.float64), rng)
    layer.running_mean[...] = rng.standard_normal(shape[1])
    layer.running_var[...] = rng.uniform(0.5, 2.0, shape[1])
    layer.train(training)
    errors = gradcheck(layer, 2 * rng.standard_normal(shape) + 1, rng)
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.exercise("batchnorm_backward")
@given(case=batchnorm_case(), seed=seeds)
def test_batchnorm_matches_torch_including_running_statistics(case, seed):
    torch = pytest.importorskip("torch")
    layer_class, shape = case
    rng = np.random.default_rng(seed)
    layer = randomise_affine(layer_class(shape[1], dtype=np.float64), rng)
    theirs = getattr(torch.nn, layer_class.__name__)(shape[1]).double()
    for _ in range(3):  # three training steps move the running statistics
        compare_with_torch(layer, theirs, 3 * rng.standard_normal(shape) - 1, rng)
    np.testing.assert_allclose(layer.running_mean, theirs.running_mean.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(layer.running_var, theirs.running_var.numpy(), rtol=1e-12, atol=1e-14)
    layer.eval()
    theirs.eval()
    compare_with_torch(layer, theirs, rng.standard_normal(shape), rng)


@pytest.mark.exercise("batchnorm_backward")
def test_batchnorm_input_gradient_is_orthogonal_to_constants_and_to_x_hat(rng):
    """Shifting a whole channel's input changes nothing after normalisation, so dx sums to zero over each
    channel; scaling it changes nothing either (when ε → 0), so dx is orthogonal to x̂ per channel."""
    layer = randomise_affine(BatchNorm2d(3, eps=1e-14, dtype=np.float64), rng)
    x = rng.standard_normal((4, 3, 5, 5))
    y = layer(x)
    dx = layer.backward(rng.standard_normal(y.shape))
    np.testing.assert_allclose(dx.sum(axis=(0, 2, 3)), 0, atol=1e-12)
    x_hat = (x - x.mean(axis=(0, 2, 3), keepdims=True)) / x.std(axis=(0, 2, 3), keepdims=True)
    np.testing.assert_allclose((dx * x_hat).sum(axis=(0, 2, 3)), 0, atol=1e-10)


def test_batchnorm_running_statistics_by_hand():
    layer = BatchNorm1d(2)
    x = np.array([[1.0, 10.0], [3.0, 10.0], [5.0, 16.0]], dtype=np.float32)
    y = layer(x)
    np.testing.assert_allclose(y.mean(axis=0), 0, atol=1e-6)
    np.testing.assert_allclose(layer.running_mean, 0.1 * np.array([3.0, 12.0]), rtol=1e-6)
    np.testing.assert_allclose(layer.running_var, 0.9 + 0.1 * np.array([4.0, 12.0]), rtol=1e-6)  # unbiased
    assert layer.running_mean.dtype == np.float32 and y.dtype == np.float32
    state = layer.state_dict()
    assert sorted(state) == ["bias", "running_mean", "running_var", "weight"]
    fresh = BatchNorm1d(2)
    fresh.load_state_dict(state)
    fresh.eval()
    layer.eval()
    np.testing.assert_array_equal(fresh(x), layer(x))


@given(leading=st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple),
       normalized=st.tuples(st.integers(1, 3), st.integers(3, 5)), k=st.integers(1, 2), affine=st.booleans(),
       seed=seeds)
def test_layernorm_gradcheck_and_torch(leading, normalized, k, affine, seed):
    rng = np.random.default_rng(seed)
    normalized = normalized[-k:]  # (last,) or (second-last, last); at least 3 values per statistic
    x = rng.standard_normal((*leading, *normalized)) * 2 + 0.5
    layer = randomise_affine(LayerNorm(normalized, elementwise_affine=affine, dtype=np.float64), rng)
    errors = gradcheck(layer, x, rng)
    assert max(errors.values()) < 1e-6, errors
    torch = pytest.importorskip("torch")
    compare_with_torch(layer, torch.nn.LayerNorm(normalized, elementwise_affine=affine), x, rng)


@given(groups=st.integers(1, 3), per_group=st.integers(1, 3), n=st.integers(1, 3),
       spatial=st.lists(st.integers(1, 3), max_size=2).map(tuple), affine=st.booleans(), seed=seeds)
def test_groupnorm_gradcheck_and_torch(groups, per_group, n, spatial, affine, seed):
    rng = np.random.default_rng(seed)
    channels = groups * per_group
    if per_group * int(np.prod(spatial)) < 3:
        spatial = (3,)  # with 1 or 2 values per group x̂ is constant (0 or ±1): nothing to check
    x = rng.standard_normal((n, channels, *spatial)) * 2 - 0.5
    layer = randomise_affine(GroupNorm(groups, channels, affine=affine, dtype=np.float64), rng)
    errors = gradcheck(layer, x, rng)
    assert max(errors.values()) < 1e-6, errors
    torch = pytest.importorskip("torch")
    compare_with_torch(layer, torch.nn.GroupNorm(groups, channels, affine=affine), x, rng)


def test_norm_parameters_flops_and_defaults():
    bn = BatchNorm2d(4)
    assert [name for name, _ in bn.named_parameters()] == ["weight", "bias"]
    assert np.array_equal(bn.weight.data, np.ones(4)) and np.array_equal(bn.running_var, np.ones(4))
    assert (bn.eps, bn.momentum) == (1e-5, 0.1)
    assert LayerNorm(5).weight.shape == (5,) and GroupNorm(2, 4).bias.shape == (4,)
    assert bn.flops((2, 4, 3, 3)) == 8 * 72
    assert LayerNorm((3, 3)).flops((2, 3, 3)) == 8 * 18 and GroupNorm(2, 4).flops((1, 4, 2)) == 64


def test_norm_errors():
    with pytest.raises(ValueError, match="expected 3 channels"):
        BatchNorm2d(3)(np.zeros((2, 4, 2, 2), np.float32))
    with pytest.raises(ValueError, match="4 dimensions"):
        BatchNorm2d(3)(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="2 or 3 dimensions"):
        BatchNorm1d(3)(np.zeros((2, 3, 2, 2), np.float32))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        BatchNorm1d(3)(np.zeros((1, 3), np.float32))
    BatchNorm1d(3).eval()(np.zeros((1, 3), np.float32))  # eval needs no batch statistics
    with pytest.raises(TypeError, match="float"):
        BatchNorm1d(3)(np.zeros((2, 3), np.int64))
    with pytest.raises(ValueError, match="momentum"):
        BatchNorm1d(3, momentum=1.5)
    with pytest.raises(ValueError, match=r"expected shape \(\.\.\., 4, 5\)"):
        LayerNorm((4, 5))(np.zeros((2, 5, 4), np.float32))
    for layer in (BatchNorm2d(3), LayerNorm(3), GroupNorm(1, 3)):
        with pytest.raises(RuntimeError, match="before forward"):
            layer.backward(np.zeros((2, 3, 1, 1), np.float32))
    with pytest.raises(ValueError, match="divisible"):
        GroupNorm(3, 4)
    with pytest.raises(ValueError, match=r"expected shape \(N, 4, \.\.\.\)"):
        GroupNorm(2, 4)(np.zeros((2, 6, 3), np.float32))
