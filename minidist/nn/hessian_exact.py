"""Exact Hessian-vector products for multi-layer perceptrons: the backward pass, differentiated.

Pearlmutter's R-operator ("Fast Exact Multiplication by the Hessian", 1994): for a direction v in
parameter space write R{q} = d/dε q(θ + ε·v) at ε = 0 for any quantity q of the forward or backward pass.
The gradient is a quantity of the backward pass, so H·v = R{∂L/∂θ}. Each line of forward and backward gets
a tangent line by the product rule, for a Linear layer (y = x·Wᵀ + b, direction V, v_b) and an elementwise
activation a = f(z):

    forward     R{y}  = R{x}·Wᵀ + x·Vᵀ + v_b             R{a}  = f'(z)·R{z}
    loss (CE)   d = (p − onehot)/N                        R{d}  = p ⊙ (R{z} − Σ_c p·R{z}) / N
    loss (MSE)  d = 2(y − t)/size                         R{d}  = 2·R{y}/size
    backward    dW = dᵀ·x,  db = Σ d,  dx = d·W            R{dW} = R{d}ᵀ·x + dᵀ·R{x},  R{db} = Σ R{d},
                                                          R{dx} = R{d}·W + d·V
                dz = f'(z)·da                             R{dz} = f''(z)·R{z}·da + f'(z)·R{da}

One pass forward and one back, each about twice the work of the plain pass: exact to rounding, with no
step size, and well defined for ReLU (f'' = 0 away from 0, as autograd's double backward takes it).
It covers Sequential models of Linear layers and ReLU / Tanh / Sigmoid; minidist.nn.hessian's central
differences cover any model.
"""

from __future__ import annotations

import numpy as np

from .activation import ReLU, Sigmoid, Tanh
from .hessian import _check_direction
from .linear import Linear
from .loss import CrossEntropyLoss, MSELoss
from .module import Module, Sequential
from .softmax import softmax


def _sigmoid(z):
    return 1 / (1 + np.exp(-z))


# f, f', f'' of each activation, as functions of the pre-activation z
ACTIVATIONS = {
    ReLU: (lambda z: np.maximum(z, 0), lambda z: (z > 0).astype(z.dtype), np.zeros_like),
    Tanh: (np.tanh, lambda z: 1 - np.tanh(z) ** 2, lambda z: -2 * np.tanh(z) * (1 - np.tanh(z) ** 2)),
    Sigmoid: (_sigmoid, lambda z: _sigmoid(z) * (1 - _sigmoid(z)),
              lambda z: _sigmoid(z) * (1 - _sigmoid(z)) * (1 - 2 * _sigmoid(z))),
}


def _check_batch(layers: list, loss_fn, x, y) -> np.ndarray:
    """ValueError unless x is (N >= 1, in) with the first Linear's in, and y holds N integer labels in
    [0, C) (CrossEntropyLoss) or is the output's (N, C) (MSELoss), C the last Linear's out. Returns y."""
    linears = [layer for layer in layers if isinstance(layer, Linear)]
    if not isinstance(x, np.ndarray) or x.ndim != 2 or len(x) == 0:
        raise ValueError(f"x must be a (N, in_features) array with N >= 1, "
                         f"got {getattr(x, 'shape', type(x).__name__)}")
    width = linears[0].weight.data.shape[1] if linears else x.shape[1]
    if x.shape[1] != width:
        raise ValueError(f"x must have the first Linear's in_features = {width} columns, got shape {x.shape}")
    n, out, y = x.shape[0], linears[-1].weight.data.shape[0] if linears else width, np.asarray(y)
    if isinstance(loss_fn, CrossEntropyLoss):
        if y.dtype.kind not in "iu":
            raise TypeError(f"y must hold integer class labels for CrossEntropyLoss, got dtype {y.dtype}")
        if y.shape != (n,):
            raise ValueError(f"y must hold one label per row of x, shape ({n},), got shape {y.shape}")
        if y.min() < 0 or y.max() >= out:
            raise ValueError(f"y's labels must lie in [0, {out}) (the model's {out} classes), "
                             f"got range [{y.min()}, {y.max()}]")
    elif y.shape != (n, out):
        raise ValueError(f"y must have the output's shape ({n}, {out}) for MSELoss, got shape {y.shape}")
    return y


def exact_hessian_vector_product(model: Module, loss_fn, x: np.ndarray, y: np.ndarray,
                                 v: list[np.ndarray]) -> list[np.ndarray]:
    """H·v of the loss of an MLP on (x (N, in), y), exactly: arrays shaped like model.parameters().

    model: a Linear, or a Sequential of Linear, ReLU, Tanh, Sigmoid (float64); loss_fn: CrossEntropyLoss
    (y: labels (N,)) or MSELoss (y: targets shaped like the output); v: one array per parameter."""
    layers = list(model) if isinstance(model, Sequential) else [model]
    for layer in layers:
        if not isinstance(layer, Linear) and type(layer) not in ACTIVATIONS:
            raise TypeError(f"exact_hessian_vector_product handles Linear, ReLU, Tanh, Sigmoid; got "
                            f"{type(layer).__name__} (use minidist.nn.hessian.hessian_vector_product)")
    if not isinstance(loss_fn, (CrossEntropyLoss, MSELoss)):
        raise TypeError(f"loss_fn must be CrossEntropyLoss or MSELoss, got {type(loss_fn).__name__}")
    direction = {id(p): d for p, d in zip(_check_direction(model, v), v)}
    y = _check_batch(layers, loss_fn, x, y)

    # forward, with tangents; keep each layer's input (a Linear's x, an activation's z) and its tangent
    h, rh, kept = x.astype(np.float64), np.zeros(x.shape), []
    for layer in layers:
        kept.append((h, rh))
        if isinstance(layer, Linear):
            w, vw = layer.weight.data, direction[id(layer.weight)]
            rh = rh @ w.T + h @ vw.T
            h = h @ w.T
            if layer.bias is not None:
                rh, h = rh + direction[id(layer.bias)], h + layer.bias.data
        else:
            f, df, _ = ACTIVATIONS[type(layer)]
            rh, h = df(h) * rh, f(h)

    # the loss's gradient with respect to the output, and its tangent
    if isinstance(loss_fn, CrossEntropyLoss):
        n, p = h.shape[0], softmax(h, axis=1)
        d = p.copy()
        d[np.arange(n), y] -= 1
        d, rd = d / n, p * (rh - np.sum(p * rh, axis=1, keepdims=True)) / n
    else:
        d, rd = 2 * (h - y) / h.size, 2 * rh / h.size

    # backward, with tangents
    result = {}
    for layer, (inp, rinp) in zip(reversed(layers), reversed(kept)):
        if isinstance(layer, Linear):
            w, vw = layer.weight.data, direction[id(layer.weight)]
            result[id(layer.weight)] = rd.T @ inp + d.T @ rinp
            if layer.bias is not None:
                result[id(layer.bias)] = rd.sum(axis=0)
            rd, d = rd @ w + d @ vw, d @ w
        else:
            _, df, d2f = ACTIVATIONS[type(layer)]
            rd, d = d2f(inp) * rinp * d + df(inp) * rd, df(inp) * d
    return [result[id(p)] for p in model.parameters()]
