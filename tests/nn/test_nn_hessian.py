"""Hessian-vector products (central differences with a Richardson step) against torch's double backward,
and power iteration against a quadratic whose spectrum we chose."""

from __future__ import annotations

import numpy as np
import pytest

from minidist import nn
from minidist.nn.gradcheck import relative_error
from minidist.nn.hessian import (
    flatten,
    hessian_vector_product,
    loss_gradient,
    sharpness,
    top_eigenvalue,
    unflatten,
)
from minidist.nn.hessian_exact import exact_hessian_vector_product


def small_mlp(rng: np.random.Generator, activation=nn.Tanh) -> nn.Sequential:
    return nn.Sequential(nn.Linear(5, 7, rng=rng, dtype=np.float64), activation(),
                         nn.Linear(7, 7, rng=rng, dtype=np.float64), nn.Sigmoid(),
                         nn.Linear(7, 3, rng=rng, dtype=np.float64))


def torch_hvp(model: nn.Sequential, x: np.ndarray, y: np.ndarray, v: list[np.ndarray]) -> list[np.ndarray]:
    """The same MLP in torch: H·v = ∂(gᵀv)/∂θ by double backward."""
    torch = pytest.importorskip("torch")
    weights = [torch.tensor(p.data, requires_grad=True) for p in model.parameters()]
    h = torch.from_numpy(x)
    linear = 0
    for layer in model:
        if isinstance(layer, nn.Linear):
            h = h @ weights[linear].T + weights[linear + 1]
            linear += 2
        else:
            h = {nn.Tanh: torch.tanh, nn.Sigmoid: torch.sigmoid, nn.ReLU: torch.relu}[type(layer)](h)
    loss = torch.nn.functional.cross_entropy(h, torch.from_numpy(y))
    grads = torch.autograd.grad(loss, weights, create_graph=True)
    dot = sum((g * torch.from_numpy(d)).sum() for g, d in zip(grads, v, strict=True))
    return [t.detach().numpy() for t in torch.autograd.grad(dot, weights)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hvp_equals_torch_double_backward(seed):
    rng = np.random.default_rng(seed)
    model = small_mlp(rng)
    x, y = rng.standard_normal((11, 5)), rng.integers(0, 3, 11)
    v = [rng.standard_normal(p.data.shape) for p in model.parameters()]
    before = [p.data.copy() for p in model.parameters()]
    ours = hessian_vector_product(model, nn.CrossEntropyLoss(), x, y, v)
    theirs = torch_hvp(model, x, y, v)
    errors = [relative_error(a, b) for a, b in zip(ours, theirs, strict=True)]
    assert max(errors) < 1e-8, errors
    # restored bitwise
    assert all(np.array_equal(p.data, b) for p, b in zip(model.parameters(), before, strict=True))
    assert all(not p.grad.any() for p in model.parameters())


def test_hvp_is_linear_in_v_and_symmetric():
    rng = np.random.default_rng(3)
    model = small_mlp(rng)
    x, y, loss = rng.standard_normal((9, 5)), rng.integers(0, 3, 9), nn.CrossEntropyLoss()
    u = [rng.standard_normal(p.data.shape) for p in model.parameters()]
    v = [rng.standard_normal(p.data.shape) for p in model.parameters()]
    hu, hv = flatten(hessian_vector_product(model, loss, x, y, u)), \
        flatten(hessian_vector_product(model, loss, x, y, v))
    scaled = flatten(hessian_vector_product(model, loss, x, y, [-2.5 * d for d in v]))
    assert relative_error(scaled, -2.5 * hv) < 1e-8
    assert abs(flatten(u) @ hv - flatten(v) @ hu) < 1e-8 * abs(flatten(u) @ hv)        # uᵀHv = vᵀHu
    zero = hessian_vector_product(model, loss, x, y, [np.zeros(p.data.shape) for p in model.parameters()])
    assert all(not z.any() for z in zero)


def test_hvp_of_a_relu_mlp_away_from_the_kinks_equals_torch():
    pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    model = small_mlp(rng, activation=nn.ReLU)
    x, y = rng.standard_normal((6, 5)), rng.integers(0, 3, 6)
    v = [rng.standard_normal(p.data.shape) for p in model.parameters()]
    # no pre-activation of the ReLU within reach of the step: the function is smooth there
    assert np.abs(model[0].forward(x)).min() > 1e-2
    ours = hessian_vector_product(model, nn.CrossEntropyLoss(), x, y, v, eps=1e-4)
    assert max(relative_error(a, b) for a, b in zip(ours, torch_hvp(model, x, y, v), strict=True)) < 1e-7


def test_power_iteration_finds_the_largest_eigenvalue_of_a_quadratic():
    rng = np.random.default_rng(5)
    spectrum = np.array([10.0, 4.0, 3.0, 1.0, 0.5, 0.1, 0.0, -2.0])
    q, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    a = q @ np.diag(spectrum) @ q.T
    eigenvalue, vector, used = top_eigenvalue(lambda v: a @ v, 8, np.random.default_rng(6), tol=1e-12,
                                              iterations=500)
    assert abs(eigenvalue - 10.0) < 1e-9 and used < 500
    assert abs(abs(vector @ q[:, 0]) - 1) < 1e-6                 # the eigenvector of 10
    # largest *magnitude*: with −12 in the spectrum, power iteration reports −12
    spectrum[-1] = -12.0
    b = q @ np.diag(spectrum) @ q.T
    assert abs(top_eigenvalue(lambda v: b @ v, 8, np.random.default_rng(6), 500, 1e-12)[0] + 12) < 1e-8


def test_sharpness_of_a_linear_least_squares_model_is_the_top_eigenvalue_of_its_hessian():
    """MSE of a bias-free Linear(4 -> 1): L = mean((Xw − y)²), H = 2XᵀX/N, known in closed form."""
    rng = np.random.default_rng(7)
    model = nn.Linear(4, 1, bias=False, rng=rng, dtype=np.float64)
    x, y = rng.standard_normal((20, 4)) * [3.0, 1.0, 0.5, 0.1], rng.standard_normal((20, 1))
    eigenvalue, vector = sharpness(model, nn.MSELoss(), x, y, np.random.default_rng(8), iterations=300,
                                   tol=1e-12)
    exact = np.linalg.eigvalsh(2 * x.T @ x / 20)[-1]
    assert abs(eigenvalue - exact) < 1e-6 * exact and vector[0].shape == (1, 4)


def test_flatten_round_trip_and_loss_gradient():
    rng = np.random.default_rng(9)
    model = small_mlp(rng)
    arrays = [rng.standard_normal(p.data.shape) for p in model.parameters()]
    back = unflatten(flatten(arrays), model.parameters())
    assert all(np.array_equal(a, b) for a, b in zip(arrays, back, strict=True))
    loss, grads = loss_gradient(model, nn.CrossEntropyLoss(), rng.standard_normal((4, 5)), np.arange(4) % 3)
    assert loss > 0 and [g.shape for g in grads] == [p.data.shape for p in model.parameters()]


def test_bad_input_is_refused():
    rng = np.random.default_rng(10)
    model, loss = small_mlp(rng), nn.CrossEntropyLoss()
    x, y = rng.standard_normal((3, 5)), np.arange(3)
    good = [np.zeros(p.data.shape) for p in model.parameters()]
    with pytest.raises(ValueError, match="one per parameter"):
        hessian_vector_product(model, loss, x, y, good[:-1])
    with pytest.raises(ValueError, match="shape"):
        hessian_vector_product(model, loss, x, y, good[:-1] + [np.zeros(7)])
    with pytest.raises(ValueError, match="eps"):
        hessian_vector_product(model, loss, x, y, good, eps=0.0)
    with pytest.raises(TypeError, match="float64"):
        hessian_vector_product(small_mlp(rng).__class__(nn.Linear(5, 3, rng=rng)), loss, x.astype(np.float32),
                               y, [np.zeros((3, 5)), np.zeros(3)])
    with pytest.raises(ValueError, match="dim"):
        top_eigenvalue(lambda v: v, 0, rng)
    with pytest.raises(ValueError, match="matvec must return"):
        top_eigenvalue(lambda v: v[:-1], 3, rng)
    with pytest.raises(ValueError, match="vector must have shape"):
        unflatten(np.zeros(3), model.parameters())


# -- the exact product: the backward pass differentiated (minidist.nn.hessian_exact) ---------------------


@pytest.mark.parametrize("activation", [nn.Tanh, nn.ReLU])
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_hvp_equals_torch_double_backward(activation, seed):
    rng = np.random.default_rng(20 + seed)
    model = small_mlp(rng, activation=activation)
    x, y = rng.standard_normal((11, 5)), rng.integers(0, 3, 11)
    v = [rng.standard_normal(p.data.shape) for p in model.parameters()]
    ours = exact_hessian_vector_product(model, nn.CrossEntropyLoss(), x, y, v)
    errors = [relative_error(a, b) for a, b in zip(ours, torch_hvp(model, x, y, v), strict=True)]
    assert max(errors) < 1e-12, errors


def test_exact_and_central_difference_products_agree_on_a_smooth_model():
    rng = np.random.default_rng(30)
    model = small_mlp(rng)
    x, y = rng.standard_normal((13, 5)), rng.integers(0, 3, 13)
    v = [rng.standard_normal(p.data.shape) for p in model.parameters()]
    exact = exact_hessian_vector_product(model, nn.CrossEntropyLoss(), x, y, v)
    differences = hessian_vector_product(model, nn.CrossEntropyLoss(), x, y, v)
    assert max(relative_error(a, b) for a, b in zip(exact, differences, strict=True)) < 1e-8


def test_exact_hvp_of_least_squares_is_2xtx_v_over_n():
    """MSE of one Linear (bias included): H = 2/N·[X 1]ᵀ[X 1] acting on (V, v_b), for every output."""
    rng = np.random.default_rng(31)
    model = nn.Linear(4, 2, rng=rng, dtype=np.float64)
    x, target = rng.standard_normal((10, 4)), rng.standard_normal((10, 2))
    v = [rng.standard_normal((2, 4)), rng.standard_normal(2)]
    hw, hb = exact_hessian_vector_product(model, nn.MSELoss(), x, target, v)
    ones = np.hstack([x, np.ones((10, 1))])
    full = 2 * ones.T @ ones / target.size                         # (5, 5), the same for each output row
    expected = (full @ np.hstack([v[0], v[1][:, None]]).T).T
    np.testing.assert_allclose(hw, expected[:, :4], rtol=1e-12)
    np.testing.assert_allclose(hb, expected[:, 4], rtol=1e-12)


def test_exact_hvp_refuses_what_it_does_not_cover():
    rng = np.random.default_rng(32)
    model = nn.Sequential(nn.Linear(5, 3, rng=rng, dtype=np.float64), nn.GELU())
    v = [np.zeros((3, 5)), np.zeros(3)]
    with pytest.raises(TypeError, match="GELU"):
        exact_hessian_vector_product(model, nn.MSELoss(), np.zeros((2, 5)), np.zeros((2, 3)), v)
    with pytest.raises(TypeError, match="loss_fn"):
        exact_hessian_vector_product(model[0], object(), np.zeros((2, 5)), np.zeros((2, 3)), v)
    with pytest.raises(ValueError, match="x must be"):
        exact_hessian_vector_product(model[0], nn.MSELoss(), np.zeros(5), np.zeros(3), v)


def test_sharpness_with_the_exact_product_on_a_relu_mlp():
    """Power iteration on the exact product finds the largest-magnitude eigenvalue of the dense Hessian
    built column by column from the same product (which must come out symmetric)."""
    rng = np.random.default_rng(33)
    model = nn.Sequential(nn.Linear(3, 4, rng=rng, dtype=np.float64), nn.ReLU(),
                          nn.Linear(4, 1, rng=rng, dtype=np.float64))
    x, target, loss = rng.standard_normal((12, 3)), rng.standard_normal((12, 1)), nn.MSELoss()
    params = model.parameters()
    size = sum(p.data.size for p in params)
    columns = [flatten(exact_hessian_vector_product(model, loss, x, target, unflatten(e, params)))
               for e in np.eye(size)]
    dense = np.array(columns).T
    assert np.allclose(dense, dense.T, atol=1e-12)
    eigenvalues = np.linalg.eigvalsh(dense)
    top = eigenvalues[np.argmax(np.abs(eigenvalues))]
    got, _ = sharpness(model, loss, x, target, np.random.default_rng(34), iterations=2000, tol=1e-13,
                       product=exact_hessian_vector_product)
    assert abs(got - top) < 1e-6 * abs(top)
