"""InstanceNorm2d and WeightNorm equal torch (float64: outputs, dx and every parameter's gradient); Batch
Renormalization equals the paper's equations, is batch norm at r_max = 1, d_max = 0, and all three pass a
float64 central-difference gradient check with a random upstream gradient."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.nn import BatchNorm2d, BatchRenorm2d, Conv2d, InstanceNorm2d, Linear, WeightNorm
from minidist.nn.gradcheck import gradcheck
from tests.nn.nn_helpers import TOL

shapes = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(2, 4), st.integers(1, 4))


@settings(max_examples=15, deadline=None)
@given(shape=shapes, affine=st.booleans(), seed=st.integers(0, 2**16))
def test_instance_norm_equals_torch(shape, affine, seed):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    layer = InstanceNorm2d(shape[1], affine=affine, dtype=np.float64)
    if affine:
        layer.weight.data[...] = rng.standard_normal(shape[1])
        layer.bias.data[...] = rng.standard_normal(shape[1])
    theirs = torch.nn.InstanceNorm2d(shape[1], affine=affine).double()
    if affine:
        with torch.no_grad():
            theirs.weight.copy_(torch.from_numpy(layer.weight.data))
            theirs.bias.copy_(torch.from_numpy(layer.bias.data))
    x = rng.standard_normal(shape)
    dy = rng.standard_normal(shape)
    y, dx = layer.forward(x), layer.backward(dy)
    tx = torch.tensor(x, requires_grad=True)
    ty = theirs(tx)
    ty.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), **TOL)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-9, atol=1e-9)
    if affine:
        np.testing.assert_allclose(layer.weight.grad, theirs.weight.grad.numpy(), **TOL)
        np.testing.assert_allclose(layer.bias.grad, theirs.bias.grad.numpy(), **TOL)


def test_instance_norm_gradcheck_and_refusals():
    rng = np.random.default_rng(0)
    layer = InstanceNorm2d(3, affine=True, dtype=np.float64)
    assert max(gradcheck(layer, rng.standard_normal((2, 3, 3, 2)), rng).values()) < 1e-6
    with pytest.raises(ValueError, match="InstanceNorm2d input"):
        InstanceNorm2d(3).forward(np.zeros((2, 3, 4)))


def _weight_normed(kind: str, dim, rng):
    layer = Linear(4, 3, rng=rng, dtype=np.float64) if kind == "linear" else \
        Conv2d(2, 3, 3, padding=1, rng=rng, dtype=np.float64)
    return WeightNorm(layer, dim=dim), layer


@pytest.mark.parametrize("kind, dim", [("linear", 0), ("linear", 1), ("conv", 0), ("conv", None)])
def test_weight_norm_equals_torch_parametrization(kind, dim):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    wrapped, layer = _weight_normed(kind, dim, rng)
    wrapped.weight_g.data *= rng.uniform(0.5, 2.0, wrapped.weight_g.shape)     # a length unlike ‖v‖
    theirs = (torch.nn.Linear(4, 3) if kind == "linear" else torch.nn.Conv2d(2, 3, 3, padding=1)).double()
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(wrapped.weight_v.data))
        theirs.bias.copy_(torch.from_numpy(layer.bias.data))
    theirs = torch.nn.utils.parametrizations.weight_norm(theirs, dim=dim)
    with torch.no_grad():
        theirs.parametrizations.weight.original0.copy_(torch.from_numpy(wrapped.weight_g.data))
    x = rng.standard_normal((2, 4) if kind == "linear" else (2, 2, 5, 5))
    y = wrapped.forward(x)
    dy = rng.standard_normal(y.shape)
    dx = wrapped.backward(dy)
    tx = torch.tensor(x, requires_grad=True)
    ty = theirs(tx)
    ty.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), **TOL)
    np.testing.assert_allclose(dx, tx.grad.numpy(), **TOL)
    g, v = theirs.parametrizations.weight.original0, theirs.parametrizations.weight.original1
    np.testing.assert_allclose(wrapped.weight_g.grad, g.grad.numpy(), **TOL)
    np.testing.assert_allclose(wrapped.weight_v.grad, v.grad.numpy(), **TOL)
    np.testing.assert_allclose(layer.bias.grad, theirs.bias.grad.numpy(), **TOL)


def test_weight_norm_parameters_gradcheck_and_length():
    rng = np.random.default_rng(2)
    wrapped, layer = _weight_normed("linear", 0, rng)
    assert [name for name, _ in wrapped.named_parameters()] == ["weight_g", "weight_v", "layer.bias"]
    np.testing.assert_allclose(wrapped.weight_g.data[:, 0], np.linalg.norm(wrapped.weight_v.data, axis=1))
    assert max(gradcheck(wrapped, rng.standard_normal((3, 4)), rng).values()) < 1e-6
    wrapped.forward(rng.standard_normal((3, 4)))                      # the gradient in v is orthogonal to v
    wrapped.zero_grad()
    wrapped.backward(rng.standard_normal((3, 3)))
    np.testing.assert_allclose((wrapped.weight_v.grad * wrapped.weight_v.data).sum(axis=1), 0, atol=1e-12)
    with pytest.raises(TypeError, match="weight Parameter"):
        WeightNorm(InstanceNorm2d(3))
    with pytest.raises(ValueError, match="dim must be"):
        WeightNorm(Linear(2, 2, rng=rng), dim=2)


def _paper_batch_renorm(x, gamma, beta, mu, sigma, r_max, d_max, eps, dy):
    """Algorithm 1 of Ioffe (2017), written out for (N, C) inputs, with its backward equations."""
    m = x.shape[0]
    mu_b = x.mean(axis=0)
    sigma_b = np.sqrt(((x - mu_b) ** 2).mean(axis=0) + eps)
    r = np.clip(sigma_b / sigma, 1 / r_max, r_max)
    d = np.clip((mu_b - mu) / sigma, -d_max, d_max)
    x_hat = (x - mu_b) / sigma_b * r + d
    y = gamma * x_hat + beta
    dx_hat = dy * gamma
    dsigma_b = np.sum(dx_hat * (x - mu_b) * (-r / sigma_b**2), axis=0)
    dmu_b = np.sum(dx_hat * (-r / sigma_b), axis=0)
    dx = dx_hat * r / sigma_b + dsigma_b * (x - mu_b) / (m * sigma_b) + dmu_b / m
    return y, dx, np.sum(dy * x_hat, axis=0), np.sum(dy, axis=0), mu_b, sigma_b


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 6), c=st.integers(1, 4), seed=st.integers(0, 2**16),
       r_max=st.floats(1.0, 3.0), d_max=st.floats(0.0, 2.0))
def test_batch_renorm_equals_the_papers_equations(n, c, seed, r_max, d_max):
    rng = np.random.default_rng(seed)
    layer = BatchRenorm2d(c, r_max=r_max, d_max=d_max, momentum=0.1, dtype=np.float64)
    layer.weight.data[...], layer.bias.data[...] = rng.standard_normal(c), rng.standard_normal(c)
    mu, sigma = rng.standard_normal(c), rng.uniform(0.2, 3.0, c)         # moving averages far from the batch
    layer.running_mean[...], layer.running_std[...] = mu, sigma
    x, dy = 3 * rng.standard_normal((n, c)) + 1, rng.standard_normal((n, c))
    y, dx = layer.forward(x), layer.backward(dy)
    want_y, want_dx, dgamma, dbeta, mu_b, sigma_b = _paper_batch_renorm(
        x, layer.weight.data, layer.bias.data, mu, sigma, r_max, d_max, layer.eps, dy)
    np.testing.assert_allclose(y, want_y, **TOL)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(layer.weight.grad, dgamma, **TOL)
    np.testing.assert_allclose(layer.bias.grad, dbeta, **TOL)
    np.testing.assert_allclose(layer.running_mean, mu + 0.1 * (mu_b - mu), **TOL)
    np.testing.assert_allclose(layer.running_std, sigma + 0.1 * (sigma_b - sigma), **TOL)
    layer.eval()                                                          # inference: the moving averages
    np.testing.assert_allclose(layer.forward(x), layer.weight.data * (x - layer.running_mean)
                               / layer.running_std + layer.bias.data, **TOL)


def test_batch_renorm_without_clipping_room_is_batch_norm():
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal((4, 3, 2, 2)), rng.standard_normal((4, 3, 2, 2))
    renorm, norm = BatchRenorm2d(3, r_max=1.0, d_max=0.0, dtype=np.float64), BatchNorm2d(3, dtype=np.float64)
    np.testing.assert_allclose(renorm.forward(x), norm.forward(x), **TOL)
    np.testing.assert_allclose(renorm.backward(dy), norm.backward(dy), **TOL)
    with pytest.raises(ValueError, match="r_max must be a finite number >= 1"):
        BatchRenorm2d(3, r_max=0.5)
    with pytest.raises(ValueError, match="d_max must be a finite number >= 0"):
        BatchRenorm2d(3, d_max=float("nan"))
