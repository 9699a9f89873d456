"""The gradient noise scale: where a larger batch stops paying.

McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training" (2018): with per-example
gradients g_i (i = 1..N) of the loss at the current weights, G = mean_i g_i and Σ their covariance, the
*simple noise scale* is

    B_noise = tr(Σ) / |G|²,      tr(Σ) = mean_i |g_i − G|²

and a step with batch B (its step tuned) makes 1/(1 + B_noise/B) of the progress of an exact-gradient step,
so the steps to a target fall as S(B) ≈ S_min·(1 + B_noise/B): halving below B_noise, flat above.
"""

from __future__ import annotations

import numpy as np

from .module import Module


def per_example_gradients(model: Module, loss_fn, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(N, number of parameters) float64: row i is the gradient of example i's loss (x[i:i+1], y[i:i+1]),
    the parameters flattened in model.parameters() order. Leaves the model's .grad at the last example's."""
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"per_example_gradients expects x and y of the same length >= 1, got {len(x)} "
                         f"and {len(y)}")
    rows = []
    for i in range(len(x)):
        model.zero_grad()
        loss_fn.forward(model.forward(x[i:i + 1]), y[i:i + 1])
        model.backward(loss_fn.backward())
        rows.append(np.concatenate([p.grad.ravel() for p in model.parameters()]).astype(np.float64))
    return np.stack(rows)


def gradient_noise_scale(grads: np.ndarray) -> tuple[float, np.ndarray]:
    """(B_noise, G) from per-example gradients grads (N, parameters), N >= 2: B_noise = tr(Σ) / |G|² with
    tr(Σ) = mean_i |g_i − G|² and G = mean_i g_i (the full-batch gradient, float64)."""
    grads = np.asarray(grads, dtype=np.float64)
    if grads.ndim != 2 or len(grads) < 2:
        raise ValueError(f"gradient_noise_scale expects grads of shape (N >= 2, parameters), "
                         f"got {grads.shape}")
    mean = grads.mean(axis=0)
    if not np.any(mean):
        raise ValueError("gradient_noise_scale: the mean gradient G is zero, so B_noise = tr(Σ)/|G|² "
                         "is undefined")
    return float(((grads - mean) ** 2).sum(axis=1).mean() / (mean @ mean)), mean
