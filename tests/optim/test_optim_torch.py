"""Trajectories against torch.optim: 30 steps, float64, an lr change at step 15, rtol 1e-10.

(SGD's cases are in test_optim_sgd.py.) Each case runs the same deterministic "training" (gradients
depend on the current weights, see optim_helpers) in minidist and in torch and compares every parameter
after every step.
"""

import numpy as np
import pytest

from minidist.optim import LARS, Adagrad, Adam, AdamW, RMSprop

from .optim_helpers import gradient, initial_values, lr_with_change, make_params, run_minidist, run_torch

adam_exercise = pytest.mark.exercise("adam")

CASES = [
    pytest.param(Adam, "Adam", {}, id="adam", marks=adam_exercise),
    pytest.param(Adam, "Adam", {"betas": (0.8, 0.95), "eps": 1e-6}, id="adam_betas", marks=adam_exercise),
    pytest.param(Adam, "Adam", {"weight_decay": 0.1}, id="adam_wd", marks=adam_exercise),
    pytest.param(Adam, "Adam", {"amsgrad": True}, id="adam_amsgrad", marks=adam_exercise),
    pytest.param(Adam, "Adam", {"amsgrad": True, "weight_decay": 0.05}, id="adam_amsgrad_wd",
                 marks=adam_exercise),
    pytest.param(AdamW, "AdamW", {}, id="adamw", marks=adam_exercise),
    pytest.param(AdamW, "AdamW", {"weight_decay": 0.3, "amsgrad": True}, id="adamw_amsgrad",
                 marks=adam_exercise),
    pytest.param(RMSprop, "RMSprop", {}, id="rmsprop"),
    pytest.param(RMSprop, "RMSprop", {"alpha": 0.9, "eps": 1e-6, "weight_decay": 0.1}, id="rmsprop_wd"),
    pytest.param(RMSprop, "RMSprop", {"momentum": 0.9}, id="rmsprop_momentum"),
    pytest.param(RMSprop, "RMSprop", {"centered": True}, id="rmsprop_centered"),
    pytest.param(RMSprop, "RMSprop", {"centered": True, "momentum": 0.5, "weight_decay": 0.01},
                 id="rmsprop_centered_momentum"),
    pytest.param(Adagrad, "Adagrad", {}, id="adagrad"),
    pytest.param(Adagrad, "Adagrad", {"lr_decay": 0.05}, id="adagrad_lr_decay"),
    pytest.param(Adagrad, "Adagrad", {"initial_accumulator_value": 0.5, "eps": 1e-6, "weight_decay": 0.1},
                 id="adagrad_init_eps_wd"),
]


def assert_same_trajectory(ours, theirs):
    for k, (mine, ref) in enumerate(zip(ours, theirs, strict=True)):
        for i, (a, b) in enumerate(zip(mine, ref, strict=True)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13, err_msg=f"step {k}, param {i}")


@pytest.mark.parametrize("cls, torch_name, options", CASES)
def test_matches_torch_over_30_steps_with_lr_change(cls, torch_name, options):
    torch = pytest.importorskip("torch")
    values = initial_values(seed=2)
    lr_of = lr_with_change(0.03)
    ours = run_minidist(cls(make_params(values), lr=0.03, **options), range(30), lr_of)
    theirs = run_torch(getattr(torch.optim, torch_name), values, dict(lr=0.03, **options), range(30), lr_of)
    assert_same_trajectory(ours, theirs)


@pytest.mark.parametrize(
    "options",
    [{"momentum": 0.0}, {"momentum": 0.9}, {"momentum": 0.9, "weight_decay": 0.05}],
    ids=["no_momentum", "momentum", "momentum_wd"],
)
def test_lars_matches_torch_sgd_on_trust_scaled_gradients(options):
    """LARS = torch.optim.SGD fed r·(g + βw), with r = η|w| / (|g| + β|w|) computed by torch."""
    torch = pytest.importorskip("torch")
    values = initial_values(seed=3)
    lr_of = lr_with_change(2.0)
    eta, beta = 0.01, options.get("weight_decay", 0.0)
    ours = run_minidist(LARS(make_params(values), lr=2.0, trust_coefficient=eta, **options), range(30), lr_of)

    params = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    sgd = torch.optim.SGD(params, lr=2.0, momentum=options["momentum"], foreach=False)
    theirs = []
    for k in range(30):
        sgd.param_groups[0]["lr"] = lr_of(k)
        for i, p in enumerate(params):
            w = p.detach()
            g = torch.from_numpy(gradient(w.numpy().copy(), k, i))
            ratio = eta * torch.linalg.norm(w) / (torch.linalg.norm(g) + beta * torch.linalg.norm(w))
            p.grad = ratio * (g + beta * w)
        sgd.step()
        theirs.append([p.detach().numpy().copy() for p in params])
    assert_same_trajectory(ours, theirs)
