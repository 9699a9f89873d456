"""Measuring sparsity: the fraction of exact zeros in weights and in the activations after each ReLU.

    sparsity(a) = #{i : a_i = 0} / n

Activation sparsity comes for free in training: ReLU's forward writes max(x, 0), so every negative
pre-activation is an exact zero, and its backward multiplies dy by [x > 0], so the same positions get
a zero gradient (max pooling's backward adds more zeros: only one position per window receives dy).
Weight sparsity has to be made, by pruning (pruning.py) or group lasso (prune_train.py).
Source: "Hardware Accelerators for Training Deep Neural Networks" tutorial, chapter "Sparsity".
"""

from __future__ import annotations

import numpy as np

from .activation import ReLU
from .module import Module, Sequential


def sparsity(a: np.ndarray) -> float:
    """Fraction of entries of ``a`` (any shape, not empty) that are exactly zero."""
    a = np.asarray(a)
    if a.size == 0:
        raise ValueError("sparsity of an empty array is undefined")
    return float(np.count_nonzero(a == 0) / a.size)


def weight_sparsity(model: Module) -> dict[str, float]:
    """{parameter name: fraction of zeros} for every parameter of model, plus "total" over all of them."""
    result, zeros, total = {}, 0, 0
    for name, p in model.named_parameters():
        result[name] = sparsity(p.data)
        zeros += int(np.count_nonzero(p.data == 0))
        total += p.size
    if total == 0:
        raise ValueError("the model has no parameters")
    result["total"] = zeros / total
    return result


def forward_with_activation_sparsity(model: Sequential, x: np.ndarray) -> tuple[np.ndarray, dict[int, float]]:
    """Run model.forward(x) layer by layer and measure the output of every ReLU on the way.

    Returns (y, {index of the ReLU in model.layers: fraction of zeros in its output}). The layers keep
    what their backward needs exactly as model.forward would, so model.backward may follow: use it in
    place of the forward pass of a training step.
    """
    if not isinstance(model, Sequential):
        raise TypeError(f"expected a Sequential, got {type(model).__name__}")
    measured = {}
    for i, layer in enumerate(model.layers):
        x = layer.forward(x)
        if isinstance(layer, ReLU):
            measured[i] = sparsity(x)
    return x, measured
