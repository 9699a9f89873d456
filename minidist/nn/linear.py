"""Linear (fully connected) layer.

Shapes (PyTorch's names): x (N, in_features) — or (..., in_features) —, weight W (out_features,
in_features), bias b (out_features,), y (N, out_features).

Forward:   y  = x · Wᵀ + b
Backward:  dx = dy · W          (N, in)
           dW = dyᵀ · x         (out, in)   added into weight.grad
           db = Σ_n dy[n]       (out,)      added into bias.grad

``input_grad=False`` skips dx: the first layer of a network needs no gradient of the data, and PyTorch
does not compute one for an input that does not require grad (backward then returns None).

The HOT CHIPS tutorial's three-layer example writes the same with the batch in columns (dX = Wᵀ·dY, dW =
dY·Xᵀ);
here the batch is in rows, as in PyTorch, so the transposes sit on the other side.
"""

from __future__ import annotations

import math

import numpy as np

from minidist.nn.checks import is_count

from .module import Module, Parameter, check_float_array, resolve_rng


class Linear(Module):
    """y = x @ W.T + b, with W initialised U(−1/√in, 1/√in) as torch.nn.Linear does."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 rng: np.random.Generator | None = None, dtype=np.float32, input_grad: bool = True):
        if not (is_count(in_features) and is_count(out_features)):
            raise ValueError(
                f"Linear needs in_features, out_features integers >= 1, got {in_features!r}, {out_features!r}"
            )
        rng = resolve_rng(rng)
        self.in_features, self.out_features = int(in_features), int(out_features)
        bound = 1.0 / np.sqrt(in_features)
        self.weight = Parameter(rng.uniform(-bound, bound, (out_features, in_features)).astype(dtype))
        self.bias = Parameter(rng.uniform(-bound, bound, out_features).astype(dtype)) if bias else None
        self.input_grad = bool(input_grad)
        self._x2d: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, shape (N, in_features) (or (..., in_features));
        returns y, shape (N, out_features) (or (..., out_features))."""
        check_float_array(x, "Linear input")
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"Linear expects input of shape (..., {self.in_features}), got {x.shape}")
        self.remember_output_shape((*x.shape[:-1], self.out_features))
        # BEGIN SOLUTION linear
        self._x2d = x.reshape(-1, self.in_features)  # keep the input: backward needs it for dW
        y = self._x2d @ self.weight.data.T
        if self.bias is not None:
            y += self.bias.data
        return y.reshape(*x.shape[:-1], self.out_features)
        # END SOLUTION

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        """dy: upstream gradient, shape (N, out_features); returns dx, shape (N, in_features) (None with
        input_grad=False); adds dW (out_features, in_features) into weight.grad, db (out_features,) into
        bias.grad."""
        self.check_upstream(dy)
        # BEGIN SOLUTION linear
        dy2d = dy.reshape(-1, self.out_features)
        self.weight.grad += dy2d.T @ self._x2d
        if self.bias is not None:
            self.bias.grad += dy2d.sum(axis=0)
        if not self.input_grad:
            return None
        dx = dy2d @ self.weight.data
        return dx.reshape(*dy.shape[:-1], self.in_features)
        # END SOLUTION

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """Forward FLOPs 2·N·in·out for an input of shape (..., in) with N = the product of the leading
        dimensions (multiply-add = 2; the bias is not counted, as in torch.utils.flop_counter).
        Backward costs twice that (dx and dW are one product each)."""
        input_shape = tuple(input_shape)
        if not input_shape or input_shape[-1] != self.in_features:
            raise ValueError(
                f"Linear.flops expects an input shape (..., {self.in_features}), got {input_shape}"
            )
        return 2 * math.prod(input_shape[:-1]) * self.in_features * self.out_features

    def __repr__(self) -> str:
        return f"Linear({self.in_features}, {self.out_features}, bias={self.bias is not None})"
