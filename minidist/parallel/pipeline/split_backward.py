"""A Linear whose backward is cut in two: B (the input gradient) now, W (the weight gradient) later.

Qi et al. 2023, "Zero Bubble Pipeline Parallelism": of a linear layer's two backward products,

    B   dx = dy · W          (N, in)    the previous stage waits for it
    W   dW = dyᵀ · x         (out, in)  nobody waits for it: it can run whenever a rank would idle
        db = Σ_n dy[n]       (out,)

B keeps (x, dy) for W; each costs one forward's FLOPs (2·N·in·out). Layers without this split (ReLU,
LayerNorm, ...) do their whole backward in B. The sum of B and W is the plain backward, product for product.
"""

from __future__ import annotations

import numpy as np

from minidist.nn.linear import Linear
from minidist.nn.module import Module


class DeferredWeightGrad(Module):
    """Wraps a Linear (sharing its Parameters): forward as the Linear; backward(dy) returns dx only and
    leaves (x, dy) in ``pending`` for ``weight_grad(pending)``, which adds dW and db. Its backward (B) costs
    one forward's FLOPs, not two (``backward_factor``, minidist.sim.compute); W costs the other."""

    backward_factor = 1

    def __init__(self, linear: Linear):
        if not isinstance(linear, Linear):
            raise TypeError(f"only a Linear splits its backward here, got {type(linear).__name__}")
        self.linear = linear
        self.pending: tuple[np.ndarray, np.ndarray] | None = None

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return self.linear.flops(input_shape)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., in) -> y (..., out), as the wrapped Linear."""
        return self.linear.forward(x)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """B: dy (..., out) -> dx (..., in); the parameters' gradients wait in ``pending`` for W."""
        lin = self.linear
        lin.check_upstream(dy)
        dy2d = dy.reshape(-1, lin.out_features)
        self.pending = (lin._x2d, dy2d)
        return (dy2d @ lin.weight.data).reshape(*dy.shape[:-1], lin.in_features)

    def weight_grad(self, pending: tuple[np.ndarray, np.ndarray]) -> None:
        """W: add dW = dyᵀ·x and db = Σ dy for the (x, dy) a B kept."""
        x2d, dy2d = pending
        self.linear.weight.grad += dy2d.T @ x2d
        if self.linear.bias is not None:
            self.linear.bias.grad += dy2d.sum(axis=0)
