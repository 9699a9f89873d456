"""Curvature of the loss: Hessian-vector products and the largest Hessian eigenvalue.

For a model with parameters θ and a loss L(θ) on a batch (x, y), the Hessian H = ∂²L/∂θ² has one row and
column per parameter entry (8,970² for the digits MLP): we never form it. What we can afford is H·v, the
directional derivative of the gradient g(θ) = ∂L/∂θ along v:

    H·v = d/dε g(θ + ε·v) |ε=0  ≈  D(ε) = (g(θ + ε·v) − g(θ − ε·v)) / 2ε          error O(ε²)
    Richardson:  H·v ≈ (4·D(ε/2) − D(ε)) / 3                                       error O(ε⁴)

Each D costs two forward + backward passes, so an H·v costs four; in float64 with ε = 1e-3 the result
agrees with an exact (double-backward) product to about 1e-11 for a smooth model. A ReLU network is
piecewise linear in its activations: where a pre-activation lies within about ε·|v| of 0 the difference
straddles the kink, and the exact product (which treats ReLU'' as 0) and this one part ways there. Over
a whole data set some pre-activation is always that close: use smooth activations (Tanh, GELU) when
measuring curvature this way (lesson 23 shows what ReLU does to it).

The top eigenvalue by power iteration (v ← H·v / |H·v|, λ = vᵀ·H·v): it converges to the eigenvalue of
largest *magnitude*, at the rate |λ₂/λ₁| per iteration. At a minimum H is (nearly) positive
semi-definite, so that is λmax, the sharpness of Keskar et al., "On Large-Batch Training for Deep
Learning: Generalization Gap and Sharp Minima" (the "Distributed Deep Learning (Part II)" slides).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .module import Module, check_float_array


def loss_gradient(model: Module, loss_fn, x: np.ndarray, y: np.ndarray) -> tuple[float, list[np.ndarray]]:
    """One forward and backward pass: (L, [∂L/∂p for p in model.parameters()]) as fresh arrays.

    The parameters' own .grad is left zeroed. Put a model with Dropout or BatchNorm in eval() first, or
    each call sees a different function."""
    model.zero_grad()
    loss = float(loss_fn.forward(model.forward(x), y))
    model.backward(loss_fn.backward())
    grads = [p.grad.copy() for p in model.parameters()]
    model.zero_grad()
    return loss, grads


def _check_direction(model: Module, v: list[np.ndarray]) -> list:
    params = model.parameters()
    if not isinstance(v, (list, tuple)) or len(v) != len(params):
        raise ValueError(f"v must be a list of {len(params)} arrays, one per parameter, "
                         f"got {type(v).__name__} of length {len(v) if hasattr(v, '__len__') else '?'}")
    for i, (p, d) in enumerate(zip(params, v)):
        check_float_array(d, f"v[{i}]")
        if d.shape != p.data.shape:
            raise ValueError(f"v[{i}] must have its parameter's shape {p.data.shape}, got {d.shape}")
    if any(p.data.dtype != np.float64 for p in params):
        raise TypeError("Hessian-vector products need a float64 model (build it with dtype=np.float64): "
                        "a difference of float32 gradients keeps about 3 digits")
    return params


def hessian_vector_product(model: Module, loss_fn, x: np.ndarray, y: np.ndarray, v: list[np.ndarray],
                           eps: float = 1e-3) -> list[np.ndarray]:
    """H·v for the loss of ``model`` on (x, y): a list of arrays shaped like the parameters.

    v: one array per parameter (model.parameters() order), float64. ε is relative: the step is
    ε / |v| along v, so the result does not depend on how v is scaled (H·(cv) = c·H·v). Central
    differences with one Richardson step (error O(ε⁴)); the parameters are restored bitwise."""
    params = _check_direction(model, v)
    if not (isinstance(eps, float) and 0 < eps < 1):
        raise ValueError(f"eps must be a float in (0, 1), got {eps!r}")
    norm = float(np.sqrt(sum(np.sum(d * d) for d in v)))
    if norm == 0:
        return [np.zeros_like(d) for d in v]
    saved = [p.data.copy() for p in params]

    def gradient_at(step: float) -> list[np.ndarray]:
        for p, w, d in zip(params, saved, v):
            p.data[...] = w + (step / norm) * d
        return loss_gradient(model, loss_fn, x, y)[1]

    def central(step: float) -> list[np.ndarray]:
        up, down = gradient_at(step), gradient_at(-step)
        return [(a - b) * (norm / (2 * step)) for a, b in zip(up, down)]

    try:
        coarse, fine = central(eps), central(eps / 2)
    finally:
        for p, w in zip(params, saved):
            p.data[...] = w
    return [(4 * f - c) / 3 for f, c in zip(fine, coarse)]


def top_eigenvalue(matvec: Callable[[np.ndarray], np.ndarray], dim: int, rng: np.random.Generator,
                   iterations: int = 100, tol: float = 1e-6) -> tuple[float, np.ndarray, int]:
    """Power iteration on a symmetric operator given as matvec (a flat vector (dim,) -> (dim,)).

    Returns (λ, v, iterations used): λ = vᵀ·A·v with |v| = 1, the eigenvalue of largest magnitude,
    stopped when λ changes by less than tol·|λ| between iterations."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"dim must be an int >= 1, got {dim!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) or iterations < 1:
        raise ValueError(f"iterations must be an int >= 1, got {iterations!r}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    v = rng.standard_normal(dim)
    v /= np.linalg.norm(v)
    eigenvalue = 0.0
    for used in range(1, iterations + 1):
        w = np.asarray(matvec(v), dtype=np.float64)
        if w.shape != (dim,):
            raise ValueError(f"matvec must return shape ({dim},), got {w.shape}")
        previous, eigenvalue = eigenvalue, float(v @ w)
        length = np.linalg.norm(w)
        if length == 0:
            return 0.0, v, used
        v = w / length
        if used > 1 and abs(eigenvalue - previous) <= tol * abs(eigenvalue):
            break
    return eigenvalue, v, used


def flatten(arrays: list[np.ndarray]) -> np.ndarray:
    """[arrays of any shapes] -> one float64 vector, in order."""
    return np.concatenate([a.ravel() for a in arrays]).astype(np.float64)


def unflatten(vector: np.ndarray, like: list) -> list[np.ndarray]:
    """The inverse of flatten: pieces of vector shaped like the arrays (or Parameters) in ``like``."""
    shapes = [getattr(a, "data", a).shape for a in like]
    sizes = [int(np.prod(s)) for s in shapes]
    if vector.shape != (sum(sizes),):
        raise ValueError(f"vector must have shape ({sum(sizes)},), got {vector.shape}")
    pieces = np.split(vector, np.cumsum(sizes)[:-1])
    return [piece.reshape(shape) for piece, shape in zip(pieces, shapes)]


def sharpness(model: Module, loss_fn, x: np.ndarray, y: np.ndarray, rng: np.random.Generator,
              iterations: int = 100, tol: float = 1e-6, product=None) -> tuple[float, list[np.ndarray]]:
    """λmax of the Hessian of the loss on (x, y) at the model's current parameters (float64 model), and
    its eigenvector shaped like the parameters, by power iteration on ``product(model, loss_fn, x, y, v)``
    (default: hessian_vector_product; hessian_exact.exact_hessian_vector_product for MLPs)."""
    params, product = model.parameters(), product or hessian_vector_product

    def matvec(flat: np.ndarray) -> np.ndarray:
        return flatten(product(model, loss_fn, x, y, unflatten(flat, params)))

    eigenvalue, vector, _ = top_eigenvalue(matvec, sum(p.data.size for p in params), rng, iterations, tol)
    return eigenvalue, unflatten(vector, params)
