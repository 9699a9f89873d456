"""Weight normalisation (Salimans & Kingma, "Weight Normalization: A Simple Reparameterization to
Accelerate Training of Deep Neural Networks", 2016): learn a direction v and a length g instead of w,

    w = g · v / ‖v‖        (‖v‖ over every axis but ``dim``: one length per output row when dim = 0)

and train g and v. Backward, from dL/dw = dW (what the wrapped layer's backward produces):

    dL/dg = Σ dW · v / ‖v‖                 dL/dv = (g / ‖v‖) · dW − (g · dL/dg / ‖v‖²) · v

(the second term removes the component of dW along v: a step in v never changes the length of w).
As ``torch.nn.utils.parametrizations.weight_norm(layer, dim=0)``, whose original0 is g and original1 is v.
"""

from __future__ import annotations

import numpy as np

from .module import Module, Parameter


class DerivedWeight:
    """The wrapped layer's weight, recomputed from (g, v) before each forward: .data, .grad and .shape like
    a Parameter, but not one, so optimizers and parameters() see g and v instead."""

    def __init__(self, data: np.ndarray):
        self.data, self.grad = data, np.zeros_like(data)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape


class WeightNorm(Module):
    """layer (any Module with a ``weight`` Parameter, e.g. Linear or Conv2d) with w = g · v / ‖v‖.

    dim: the axis that keeps its own length (0: per output unit, as torch's default), or None: one length
    for the whole tensor. Parameters: ``weight_g`` (‖w‖ at wrapping; the shape of w with the reduced axes 1,
    as torch; a scalar for dim=None), ``weight_v`` (w at wrapping), then the layer's other parameters.
    """

    def __init__(self, layer: Module, dim: int | None = 0):
        if not isinstance(layer, Module) or not isinstance(getattr(layer, "weight", None), Parameter):
            raise TypeError(f"WeightNorm wraps a Module with a weight Parameter, got {type(layer).__name__}")
        w = layer.weight.data
        is_axis = not isinstance(dim, bool) and isinstance(dim, int) and -w.ndim <= dim < w.ndim
        if dim is not None and not is_axis:
            raise ValueError(f"WeightNorm: dim must be None or an axis of the weight {w.shape}, got {dim!r}")
        kept = None if dim is None else dim % w.ndim
        self.axes = tuple(a for a in range(w.ndim) if a != kept)
        self.dim = dim
        length = self._norm(w)                                # keepdims: size 1 on every reduced axis
        self.weight_g = Parameter(length.reshape(()) if dim is None else length)
        self.weight_v = Parameter(w.copy())
        layer.weight = DerivedWeight(w.copy())
        self.layer = layer

    def _norm(self, v: np.ndarray) -> np.ndarray:
        return np.sqrt((v * v).sum(axis=self.axes, keepdims=True))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: the layer's input; returns the layer's output with w = g · v / ‖v‖."""
        self._v_norm = self._norm(self.weight_v.data)
        self.layer.weight.data = self.weight_g.data * self.weight_v.data / self._v_norm
        y = self.layer.forward(x)
        self.remember_output_shape(y.shape)
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: gradient of the layer's output; returns dx; adds dL/dg and dL/dv (and the layer's bias)."""
        self.check_upstream(dy)                       # before anything changes
        derived = self.layer.weight
        derived.grad = np.zeros_like(derived.data)
        dx = self.layer.backward(dy)
        dw, g, v, n = derived.grad, self.weight_g.data, self.weight_v.data, self._v_norm
        dg = (dw * v).sum(axis=self.axes, keepdims=True) / n
        self.weight_g.grad += dg.reshape(g.shape)
        self.weight_v.grad += (g / n) * dw - (g * dg / n**2) * v
        return dx

    @property
    def input_grad(self) -> bool:
        return getattr(self.layer, "input_grad", True)

    @input_grad.setter
    def input_grad(self, wanted: bool) -> None:
        if hasattr(self.layer, "input_grad"):
            self.layer.input_grad = wanted

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return self.layer.flops(input_shape) + 3 * self.weight_v.size

    def __repr__(self) -> str:
        return f"WeightNorm({self.layer!r}, dim={self.dim})"
