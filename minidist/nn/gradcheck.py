"""Finite-difference gradient checks.

For a module f and a *random* upstream gradient g (random, so that no error can hide behind a
symmetric ``sum``), the scalar L(x, θ) = Σ g ⊙ f(x; θ) has
    ∂L/∂x = f.backward(g)          and    ∂L/∂θ = what backward added into θ.grad.
Each is compared with the central difference (L(v + h) − L(v − h)) / 2h, element by element, in float64.

The reported error of one array is  max|analytic − numeric| / max(max|analytic|, max|numeric|, tiny):
a relative error on the scale of the whole gradient, which stays meaningful when single elements are 0.
"""

from __future__ import annotations

import numpy as np

from .module import Module


def relative_error(analytic: np.ndarray, numeric: np.ndarray) -> float:
    scale = max(np.abs(analytic).max(initial=0.0), np.abs(numeric).max(initial=0.0), 1e-30)
    return float(np.abs(analytic - numeric).max(initial=0.0) / scale)


def numerical_gradient(f, v: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar function f() with respect to the array v (changed in place)."""
    grad = np.zeros_like(v)
    flat, gflat = v.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        up = f()
        flat[i] = old - eps
        down = f()
        flat[i] = old
        gflat[i] = (up - down) / (2 * eps)
    return grad


def gradcheck(module: Module, x: np.ndarray, rng: np.random.Generator, eps: float = 1e-6,
              before_forward=None) -> dict[str, float]:
    """Check dx and every parameter gradient of ``module`` at input ``x`` (both must be float64).

    ``before_forward`` (optional) is called before every forward pass — e.g. to reset a Dropout's rng so
    that every evaluation draws the same mask. Returns {"input": err, "<param name>": err, ...}; use
    ``max(result.values())`` for the worst.
    """
    if x.dtype != np.float64 or any(p.data.dtype != np.float64 for p in module.parameters()):
        raise TypeError("gradcheck needs float64 input and parameters (float32 differences are too coarse)")
    prepare = before_forward or (lambda: None)
    prepare()
    y = module.forward(x)
    upstream = rng.standard_normal(y.shape)

    def loss() -> float:
        prepare()
        return float(np.sum(upstream * module.forward(x)))

    module.zero_grad()
    prepare()
    module.forward(x)
    dx = module.backward(upstream)
    analytic = {name: p.grad.copy() for name, p in module.named_parameters()}

    errors = {"input": relative_error(dx, numerical_gradient(loss, x, eps))}
    for name, p in module.named_parameters():
        errors[name] = relative_error(analytic[name], numerical_gradient(loss, p.data, eps))
    return errors


def gradcheck_loss(loss_fn, prediction: np.ndarray, target: np.ndarray, eps: float = 1e-6) -> float:
    """Check a loss's d loss / d prediction against central differences (float64 prediction)."""
    if prediction.dtype != np.float64:
        raise TypeError("gradcheck_loss needs a float64 prediction")
    loss_fn.forward(prediction, target)
    analytic = loss_fn.backward()
    numeric = numerical_gradient(lambda: loss_fn.forward(prediction, target), prediction, eps)
    return relative_error(analytic, numeric)
