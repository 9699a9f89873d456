"""Shared by the optim tests: a small deterministic "training run" driven by a gradient function.

The gradient of step k depends on the current parameters (so the trajectory feeds back on itself, as in
real training) and on fixed per-step noise: g = 0.5·w³ − w + noise_k. Both minidist and torch runs use
this same NumPy function, so any difference between the trajectories comes from the optimizers.
"""

from __future__ import annotations

import numpy as np

from minidist.nn import Parameter

SHAPES = [(3, 4), (5,), (1,)]


def initial_values(seed: int = 0, dtype=np.float64) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape).astype(dtype) for shape in SHAPES]


def gradient(w: np.ndarray, step: int, index: int) -> np.ndarray:
    noise = np.random.default_rng([step, index]).normal(scale=0.5, size=w.shape).astype(w.dtype)
    return 0.5 * w**3 - w + noise


def make_params(values: list[np.ndarray]) -> list[Parameter]:
    return [Parameter(v.copy()) for v in values]


def run_minidist(optimizer, steps: range, lr_schedule=None) -> list[list[np.ndarray]]:
    """Run optimizer for the given step numbers; returns the parameters (copies) after every step."""
    history = []
    for k in steps:
        if lr_schedule is not None:
            optimizer.lr = lr_schedule(k)
        for i, p in enumerate(optimizer.params):
            p.grad[...] = gradient(p.data, k, i)
        optimizer.step()
        history.append([p.data.copy() for p in optimizer.params])
    return history


def run_torch(torch_optimizer_class, values, kwargs, steps: range, lr_schedule) -> list[list[np.ndarray]]:
    import torch

    params = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    opt = torch_optimizer_class(params, foreach=False, **kwargs)
    history = []
    for k in steps:
        for group in opt.param_groups:
            group["lr"] = lr_schedule(k)
        for i, p in enumerate(params):
            p.grad = torch.from_numpy(gradient(p.detach().numpy().copy(), k, i))
        opt.step()
        history.append([p.detach().numpy().copy() for p in params])
    return history


def lr_with_change(base: float, factor: float = 0.3, at: int = 15):
    """The learning rate base for steps < at, then base·factor: the mid-run change the tests require."""
    return lambda k: base if k < at else base * factor
