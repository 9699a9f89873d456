"""SGD: hand-computed steps, torch.optim.SGD trajectories, hypothesis properties, bad hyper-parameters."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import Parameter
from minidist.optim import SGD

from .optim_helpers import gradient, initial_values, lr_with_change, make_params, run_minidist, run_torch

momentum_exercise = pytest.mark.exercise("sgd_momentum")


def scalar_run(grads, **kwargs) -> list[float]:
    """w starts at 1.0; feed the given gradients one per step; return w after each step."""
    p = Parameter(np.array([1.0]))
    opt = SGD([p], **kwargs)
    out = []
    for g in grads:
        p.grad[...] = g
        opt.step()
        out.append(float(p.data[0]))
    return out


def test_plain_sgd_by_hand():
    # w1 = 1 − 0.1·1 = 0.9;  w2 = 0.9 − 0.1·2 = 0.7
    assert scalar_run([1.0, 2.0], lr=0.1) == pytest.approx([0.9, 0.7], abs=1e-15)


def test_weight_decay_by_hand():
    # g' = g + λw = 1 + 0.1·1 = 1.1  ->  w1 = 1 − 0.1·1.1 = 0.89
    assert scalar_run([1.0], lr=0.1, weight_decay=0.1) == pytest.approx([0.89], abs=1e-15)


@momentum_exercise
def test_momentum_by_hand():
    # b1 = g1 = 1 -> w1 = 0.9; b2 = 0.9·1 + 2 = 2.9 -> w2 = 0.61; b3 = 0.9·2.9 + 3 = 5.61 -> w3 = 0.049
    assert scalar_run([1.0, 2.0, 3.0], lr=0.1, momentum=0.9) == pytest.approx([0.9, 0.61, 0.049], abs=1e-14)


@momentum_exercise
def test_dampening_by_hand():
    # b1 = g1 = 1 (no dampening on step 1) -> w1 = 0.9; b2 = 0.9·1 + 0.5·2 = 1.9 -> w2 = 0.9 − 0.19 = 0.71
    assert scalar_run([1.0, 2.0], lr=0.1, momentum=0.9, dampening=0.5) == pytest.approx(
        [0.9, 0.71], abs=1e-14
    )


@momentum_exercise
def test_nesterov_by_hand():
    # b1 = 1, step along g1 + μ b1 = 1.9 -> w1 = 0.81
    # b2 = 0.9 + 2 = 2.9, step along g2 + μ b2 = 2 + 2.61 = 4.61 -> w2 = 0.81 − 0.461 = 0.349
    assert scalar_run([1.0, 2.0], lr=0.1, momentum=0.9, nesterov=True) == pytest.approx([0.81, 0.349],
                                                                                         abs=1e-14)


@momentum_exercise
def test_lr_change_rescales_the_whole_buffer():
    # torch's convention: w −= γ_t b_t, so after γ drops from 0.1 to 0.01 the step is 0.01·b2 = 0.029,
    # not the slide's μ·M1 − γ2·g2 = 0.9·(−0.1) − 0.01·2 = −0.11.
    p = Parameter(np.array([1.0]))
    opt = SGD([p], lr=0.1, momentum=0.9)
    p.grad[...] = 1.0
    opt.step()
    opt.lr = 0.01
    p.grad[...] = 2.0
    opt.step()
    assert p.data[0] == pytest.approx(0.9 - 0.029, abs=1e-15)


SGD_OPTIONS = [
    pytest.param({}, id="plain"),
    pytest.param({"weight_decay": 0.05}, id="weight_decay"),
    pytest.param({"momentum": 0.9}, id="momentum", marks=momentum_exercise),
    pytest.param({"momentum": 0.8, "dampening": 0.3}, id="dampening", marks=momentum_exercise),
    pytest.param({"momentum": 0.9, "nesterov": True}, id="nesterov", marks=momentum_exercise),
    pytest.param({"momentum": 0.7, "weight_decay": 0.1, "nesterov": True}, id="nesterov_wd",
                 marks=momentum_exercise),
]


@pytest.mark.parametrize("options", SGD_OPTIONS)
def test_matches_torch_over_30_steps_with_lr_change(options):
    torch = pytest.importorskip("torch")
    values = initial_values(seed=1)
    lr_of = lr_with_change(0.05)
    ours = run_minidist(SGD(make_params(values), lr=0.05, **options), range(30), lr_of)
    theirs = run_torch(torch.optim.SGD, values, dict(lr=0.05, **options), range(30), lr_of)
    for k, (mine, ref) in enumerate(zip(ours, theirs, strict=True)):
        for a, b in zip(mine, ref, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13, err_msg=f"step {k}")


@given(lr=st.floats(0, 1), seed=st.integers(0, 2**16), steps=st.integers(1, 5))
def test_momentum_zero_is_plain_gradient_descent(lr, seed, steps):
    values = initial_values(seed)
    opt = SGD(make_params(values), lr=lr, momentum=0.0)
    history = run_minidist(opt, range(steps))
    w = [v.copy() for v in values]
    for k in range(steps):
        w = [wi - lr * gradient(wi, k, i) for i, wi in enumerate(w)]
        for a, b in zip(history[k], w, strict=True):
            np.testing.assert_array_equal(a, b)


@given(lr=st.floats(1e-3, 1), weight_decay=st.floats(1e-4, 1), seed=st.integers(0, 2**16))
def test_weight_decay_differs_by_the_decay_term(lr, weight_decay, seed):
    """One step with decay λ = one step without, minus γλw (up to rounding)."""
    values = initial_values(seed)
    plain, decayed = make_params(values), make_params(values)
    for a, b in zip(plain, decayed, strict=True):
        a.grad[...] = b.grad[...] = np.random.default_rng(seed).normal(size=a.shape)
    SGD(plain, lr=lr).step()
    SGD(decayed, lr=lr, weight_decay=weight_decay).step()
    for a, b, w in zip(plain, decayed, values, strict=True):
        np.testing.assert_allclose(b.data, a.data - lr * weight_decay * w, rtol=1e-12, atol=1e-14)


@momentum_exercise
@given(momentum=st.floats(0.01, 0.99), seed=st.integers(0, 2**16), steps=st.integers(1, 8))
def test_momentum_buffer_is_weighted_sum_of_gradients(momentum, seed, steps):
    """b_t = Σ_k μ^(t−k) g_k (the slide's "momentum as gradient averaging", with τ = 0)."""
    rng = np.random.default_rng(seed)
    p = Parameter(np.zeros(6))
    opt = SGD([p], lr=0.0, momentum=momentum)  # lr 0: w stays put, only the buffer moves
    grads = rng.normal(size=(steps, 6))
    for g in grads:
        p.grad[...] = g
        opt.step()
    weights = momentum ** np.arange(steps - 1, -1, -1)
    np.testing.assert_allclose(opt.state[0]["momentum_buffer"], weights @ grads, rtol=1e-12, atol=1e-12)


def test_step_leaves_gradients_untouched():
    p = Parameter(np.ones(4))
    p.grad[...] = 2.0
    SGD([p], lr=0.1, weight_decay=0.5).step()
    np.testing.assert_array_equal(p.grad, np.full(4, 2.0))


def test_zero_grad_and_float32_stays_float32():
    p = Parameter(np.ones(3, dtype=np.float32))
    p.grad[...] = 1.0
    opt = SGD([p], lr=0.5)
    opt.step()
    assert p.data.dtype == np.float32 and p.data[0] == np.float32(0.5)
    opt.zero_grad()
    np.testing.assert_array_equal(p.grad, 0.0)


@pytest.mark.parametrize("kwargs, allowed", [
    ({"lr": -0.1}, r"lr must be a finite number in \[0, inf\)"),
    ({"lr": float("nan")}, "lr must be a finite number"),
    ({"lr": 0.1, "momentum": 1.0}, r"momentum must be a finite number in \[0, 1\)"),
    ({"lr": 0.1, "momentum": -0.5}, r"momentum .* \[0, 1\)"),
    ({"lr": 0.1, "dampening": 1.5}, r"dampening .* \[0, 1\]"),
    ({"lr": 0.1, "weight_decay": -1e-4}, r"weight_decay .* \[0, inf\)"),
    ({"lr": 0.1, "nesterov": True}, r"nesterov=True needs momentum in \(0, 1\)"),
    ({"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "nesterov": True}, "dampening == 0"),
])
def test_bad_hyper_parameters_say_what_is_allowed(kwargs, allowed):
    with pytest.raises(ValueError, match=allowed):
        SGD([Parameter(np.zeros(2))], **kwargs)


def test_bad_params_and_lr_assignment():
    p = Parameter(np.zeros(2))
    with pytest.raises(TypeError, match="minidist.nn.Parameter"):
        SGD([np.zeros(2)], lr=0.1)
    with pytest.raises(ValueError, match="empty"):
        SGD([], lr=0.1)
    with pytest.raises(ValueError, match="more than once"):
        SGD([p, p], lr=0.1)
    opt = SGD([p], lr=0.1)
    with pytest.raises(ValueError, match="lr must be"):
        opt.lr = -1.0
    assert opt.lr == 0.1
    opt.lr = 0.2
    assert opt.lr == 0.2
