"""Softmax along one axis, stable, with its backward in Jacobian-vector form.

    y_i  = e^(x_i − m) / Σ_j e^(x_j − m),   m = max_j x_j     (the max subtraction changes nothing
                                                               mathematically and keeps e^(·) ≤ 1)
    dx   = y ⊙ (dy − Σ_j dy_j y_j)                             (J = diag(y) − y yᵀ applied to dy,
                                                               never forming the T×T Jacobian)
    log_softmax(x) = x − m − log Σ_j e^(x_j − m)               (what a loss needs: no log of a 0)

Masked entries (−inf in x, as the causal mask puts there) give y = 0 and receive dx = 0.
Cost: about 5 operations per element forward (max, subtract, exp, sum, divide), 4 backward.
"""

from __future__ import annotations

import math

import numpy as np

from .module import Module, check_float_array


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """x: any shape; returns y of x's shape and dtype, non-negative, summing to 1 along ``axis``."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    e /= e.sum(axis=axis, keepdims=True)
    return e


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """x: any shape; returns log softmax(x) along ``axis``, computed without taking the log of a 0."""
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def softmax_backward(y: np.ndarray, dy: np.ndarray, axis: int = -1) -> np.ndarray:
    """y: softmax output kept by forward; dy: upstream gradient, shape of y; returns dx, shape of y.

    dx = y ⊙ (dy − Σ dy ⊙ y) along ``axis``: the Jacobian diag(y) − y yᵀ times dy, in O(n) per row.
    """
    # BEGIN SOLUTION softmax_backward
    return y * (dy - (dy * y).sum(axis=axis, keepdims=True))
    # END SOLUTION


class Softmax(Module):
    """Softmax along ``dim`` (torch.nn.Softmax); no parameters."""

    def __init__(self, dim: int = -1):
        if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
            raise TypeError(f"Softmax dim must be an int, got {type(dim).__name__}")
        self.dim = int(dim)
        self._y: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, any shape with at least one dimension; returns y, shape of x."""
        check_float_array(x, "Softmax input")
        if not -x.ndim <= self.dim < x.ndim:
            raise ValueError(f"Softmax(dim={self.dim}) is out of range for an input of shape {x.shape}")
        self.remember_output_shape(x.shape)
        self._y = softmax(x, self.dim)
        return self._y

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape of x; returns dx = y ⊙ (dy − Σ dy ⊙ y), shape of x."""
        self.check_upstream(dy)
        return softmax_backward(self._y, dy, self.dim)

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return 5 * math.prod(input_shape)

    def __repr__(self) -> str:
        return f"Softmax(dim={self.dim})"
