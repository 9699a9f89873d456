"""Batch Renormalization (Ioffe, "Batch Renormalization: Towards Reducing Minibatch Dependence in
Batch-Normalized Models", 2017): batch norm whose training output is corrected towards what the moving
averages would give, so that training and inference compute the same function even for small or
non-i.i.d. batches. Per channel, batch statistics μ_B, σ_B = √(σ²_B + ε) and moving averages μ, σ:

    r = clip(σ_B / σ, 1/r_max, r_max),   d = clip((μ_B − μ) / σ, −d_max, d_max)      (constants: no gradient)
    x̂ = (x − μ_B) / σ_B · r + d,         y = γ x̂ + β
    μ ← μ + α(μ_B − μ),   σ ← σ + α(σ_B − σ)                 inference: x̂ = (x − μ) / σ

With r = 1 and d = 0 (r_max = 1, d_max = 0) it is batch norm. Because r and d are constants, the backward
is batch norm's with the gradient reaching x̂ multiplied by r (the paper's Algorithm 1 equations).
"""

from __future__ import annotations

import numpy as np

from minidist.nn.checks import check_count, check_eps, check_real

from .module import Module, Parameter, check_float_array
from .norm import _normalize_backward


class BatchRenorm2d(Module):
    """Batch Renormalization of (N, C, H, W) (or (N, C)) inputs, one (μ, σ) moving pair per channel.

    num_features: C. r_max ≥ 1, d_max ≥ 0: the clips (the paper raises them from 1 and 0 during training;
    set the attributes to schedule them). momentum: α of the moving averages. eps > 0. affine: γ, β (C,).
    Buffers: running_mean (μ), running_std (σ).
    """

    def __init__(self, num_features: int, r_max: float = 3.0, d_max: float = 5.0, momentum: float = 0.01,
                 eps: float = 1e-5, affine: bool = True, *, dtype=np.float32):
        check_count(num_features, "BatchRenorm2d: num_features")
        self.r_max, self.d_max = check_real(r_max, "BatchRenorm2d: r_max", 1.0), \
            check_real(d_max, "BatchRenorm2d: d_max", 0.0)
        self.momentum = check_real(momentum, "BatchRenorm2d: momentum", 0.0, maximum=1.0)
        self.num_features, self.eps = int(num_features), check_eps(eps, "BatchRenorm2d")
        self.weight = Parameter(np.ones(num_features, dtype=dtype)) if affine else None
        self.bias = Parameter(np.zeros(num_features, dtype=dtype)) if affine else None
        self.register_buffer("running_mean", np.zeros(num_features, dtype=dtype))
        self.register_buffer("running_std", np.ones(num_features, dtype=dtype))

    def _channels(self, v: np.ndarray, ndim: int) -> np.ndarray:
        return v.reshape(1, -1, *([1] * (ndim - 2)))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: (N, C) or (N, C, H, W); returns y, shape of x."""
        check_float_array(x, "BatchRenorm2d input", ndim=(2, 4))
        if x.shape[1] != self.num_features:
            raise ValueError(f"BatchRenorm2d input: expected {self.num_features} channels, "
                             f"got shape {x.shape}")
        self._axes, self._training_pass = (0, *range(2, x.ndim)), self.training
        self.remember_output_shape(x.shape)
        if self.training:
            if x.size // self.num_features < 2:
                raise ValueError(f"BatchRenorm2d: training needs more than 1 value per channel, "
                                 f"got shape {x.shape}")
            mean, std = x.mean(axis=self._axes), np.sqrt(x.var(axis=self._axes) + self.eps)
            running_std = self.running_std.astype(x.dtype)
            r = np.clip(std / running_std, 1 / self.r_max, self.r_max)
            d = np.clip((mean - self.running_mean) / running_std, -self.d_max, self.d_max)
            self.running_mean[...] += self.momentum * (mean - self.running_mean)
            self.running_std[...] += self.momentum * (std - self.running_std)
            self.r, self.d = r, d
            self._inv_std = self._channels(1 / std, x.ndim).astype(x.dtype)
            self._x_bn = (x - self._channels(mean, x.ndim)) * self._inv_std        # batch norm's x̂
            x_hat = self._x_bn * self._channels(r, x.ndim) + self._channels(d, x.ndim)
        else:
            self._inv_std = self._channels(1 / self.running_std, x.ndim).astype(x.dtype)
            x_hat = (x - self._channels(self.running_mean, x.ndim)) * self._inv_std
        self._x_hat = x_hat.astype(x.dtype)
        if self.weight is None:
            return self._x_hat
        return self._x_hat * self._channels(self.weight.data, x.ndim) + self._channels(self.bias.data, x.ndim)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: shape of x; returns dx; adds dγ = Σ dy·x̂ and dβ = Σ dy (C,)."""
        self.check_upstream(dy)
        g = dy
        if self.weight is not None:
            self.weight.grad += (dy * self._x_hat).sum(axis=self._axes)
            self.bias.grad += dy.sum(axis=self._axes)
            g = dy * self._channels(self.weight.data, dy.ndim)
        if not self._training_pass:                       # moving averages are constants
            return g * self._inv_std
        g = g * self._channels(self.r, dy.ndim)           # dL/d(batch norm's x̂) = r · dL/dx̂
        return _normalize_backward(g, self._x_bn, self._inv_std, self._axes).astype(dy.dtype)

    def __repr__(self) -> str:
        return (f"BatchRenorm2d({self.num_features}, r_max={self.r_max}, d_max={self.d_max}, "
                f"momentum={self.momentum})")
