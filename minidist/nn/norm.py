"""Normalisation layers: BatchNorm1d/2d, LayerNorm, GroupNorm (torch.nn's names and semantics).

All four compute, over a set of axes S (the "statistics axes", m elements per statistic),
    μ = mean_S(x),   σ² = mean_S((x − μ)²)   (biased),   x̂ = (x − μ) / √(σ² + ε),   y = γ · x̂ + β
and differ only in S (the "Hardware Accelerators for Training Deep Neural Networks" slides, "Batch / Layer /
Group Norm"):
    BatchNorm   S = batch and spatial axes, one (μ, σ²) per channel     x (N, C) / (N, C, L) / (N, C, H, W)
    LayerNorm   S = the last len(normalized_shape) axes, one per sample
    GroupNorm   S = the channels of one group and all spatial axes, one per (sample, group)

Backward, with g = dy · γ (the gradient reaching x̂) and means over S:
    dx = (g − mean_S(g) − x̂ · mean_S(g · x̂)) / √(σ² + ε)
    dγ = Σ dy · x̂,   dβ = Σ dy        (summed over every axis that γ does not have)
The two subtracted terms are the paths through μ and σ²: every input moves every statistic.

BatchNorm in training uses the batch statistics and updates its running estimates as PyTorch does,
    running_mean ← (1 − momentum) · running_mean + momentum · μ
    running_var  ← (1 − momentum) · running_var  + momentum · σ² · m / (m − 1)   (unbiased variance);
in eval it normalises with the running estimates, which are then constants: dx = dy · γ / √(var + ε).
"""

from __future__ import annotations

import math

import numpy as np

from minidist.nn.checks import check_count, check_eps, check_real, is_count

from .module import Module, Parameter, check_float_array

# FLOPs per element, forward: statistics (mean: 1, variance: 3) + normalise (2) + scale and shift (2)
_NORM_FLOPS_PER_ELEMENT = 8


def _normalize_backward(g: np.ndarray, x_hat: np.ndarray, inv_std: np.ndarray, axes) -> np.ndarray:
    """dx of x̂ = (x − μ)·inv_std with μ, σ² taken over ``axes``, given g = dL/dx̂ (see module docstring)."""
    gx = g * x_hat
    gx_mean = gx.mean(axis=axes, keepdims=True)
    dx = g - g.mean(axis=axes, keepdims=True)
    dx -= np.multiply(x_hat, gx_mean, out=gx)     # the same operations in the same order, two temporaries
    dx *= inv_std
    return dx


class _BatchNorm(Module):
    expected_ndim: tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 *, dtype=np.float32):
        check_count(num_features, f"{type(self).__name__}: num_features")
        self.momentum = check_real(momentum, f"{type(self).__name__}: momentum", 0.0, maximum=1.0)
        self.num_features, self.eps = int(num_features), check_eps(eps, type(self).__name__)
        self.weight = Parameter(np.ones(num_features, dtype=dtype)) if affine else None
        self.bias = Parameter(np.zeros(num_features, dtype=dtype)) if affine else None
        self.register_buffer("running_mean", np.zeros(num_features, dtype=dtype))
        self.register_buffer("running_var", np.ones(num_features, dtype=dtype))
        self._x_hat: np.ndarray | None = None

    def _per_channel(self, v: np.ndarray, ndim: int) -> np.ndarray:
        """A (C,) vector shaped to broadcast against the input: (1, C, 1, ...)."""
        return v.reshape(1, -1, *([1] * (ndim - 2)))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, shape (N, C) or (N, C, L) (BatchNorm1d), (N, C, H, W) (BatchNorm2d); returns y, shape of
        x."""
        what = f"{type(self).__name__} input"
        check_float_array(x, what, ndim=self.expected_ndim)
        if x.shape[1] != self.num_features:
            raise ValueError(
                f"{what}: expected {self.num_features} channels in dimension 1, got shape {x.shape}"
            )
        self._axes = (0, *range(2, x.ndim))  # every axis but the channels
        self._batch_statistics = self.training  # which statistics this forward used decides the backward
        if self.training:
            mean, var, count = self._statistics(x, what)
            m = self.momentum
            self.running_mean[...] = (1 - m) * self.running_mean + m * mean
            self.running_var[...] = (1 - m) * self.running_var + m * var * (count / (count - 1))
        else:
            mean, var = self.running_mean.astype(x.dtype), self.running_var.astype(x.dtype)
        self.remember_output_shape(x.shape)
        self._inv_std = self._per_channel(1.0 / np.sqrt(var + self.eps), x.ndim).astype(x.dtype)
        self._x_hat = (x - self._per_channel(mean, x.ndim).astype(x.dtype)) * self._inv_std
        if self.weight is None:
            return self._x_hat
        return self._x_hat * self._per_channel(self.weight.data, x.ndim) + self._per_channel(
            self.bias.data, x.ndim
        )

    def _statistics(self, x: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray, int]:
        """Training: the per-channel mean and biased variance (C,) of x over every axis but the channels,
        and the number of values per channel (SyncBatchNorm: over the global batch of all ranks)."""
        count = x.size // self.num_features
        if count < 2:
            raise ValueError(f"{what}: training needs more than 1 value per channel, got shape {x.shape}")
        return x.mean(axis=self._axes), x.var(axis=self._axes), count

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape of x; returns dx, shape of x; adds dγ (C,) into weight.grad and
        dβ (C,) into bias.grad."""
        self.check_upstream(dy)
        # BEGIN SOLUTION batchnorm_backward
        x_hat, inv_std, axes = self._x_hat, self._inv_std, self._axes
        if self.weight is not None:
            self.weight.grad += (dy * x_hat).sum(axis=axes)
            self.bias.grad += dy.sum(axis=axes)
            g = dy * self._per_channel(self.weight.data, dy.ndim)  # dL/dx̂
        else:
            g = dy
        if not self._batch_statistics:  # running statistics are constants: x̂ is an affine function of x
            return g * inv_std
        g_mean = g.mean(axis=axes, keepdims=True)                   # path through μ
        gx_mean = (g * x_hat).mean(axis=axes, keepdims=True)        # path through σ²
        return inv_std * (g - g_mean - x_hat * gx_mean)
        # END SOLUTION

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return _NORM_FLOPS_PER_ELEMENT * math.prod(input_shape)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.weight is not None})")


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of (N, C) or (N, C, L) inputs, one (μ, σ²) per channel."""

    expected_ndim = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of (N, C, H, W) images, one (μ, σ²) per channel."""

    expected_ndim = (4,)


class LayerNorm(Module):
    """Normalise each sample over its last dimensions (torch.nn.LayerNorm); γ, β of normalized_shape."""

    def __init__(
        self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, *, dtype=np.float32
    ):
        shape = (
            (normalized_shape,)
            if isinstance(normalized_shape, (int, np.integer))
            else tuple(normalized_shape)
        )
        if not shape or not all(is_count(s) for s in shape):
            raise ValueError(
                f"LayerNorm needs a non-empty normalized_shape of integer sizes >= 1, "
                f"got {normalized_shape!r}"
            )
        self.normalized_shape, self.eps = tuple(int(s) for s in shape), check_eps(eps, type(self).__name__)
        self.weight = Parameter(np.ones(self.normalized_shape, dtype=dtype)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(self.normalized_shape, dtype=dtype)) if elementwise_affine else None
        self._x_hat: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, shape (..., *normalized_shape); returns y, shape of x."""
        check_float_array(x, "LayerNorm input")
        k = len(self.normalized_shape)
        if x.shape[x.ndim - k:] != self.normalized_shape or x.ndim < k:
            raise ValueError(
                f"LayerNorm input: expected shape (..., {', '.join(map(str, self.normalized_shape))})"
                f", got {x.shape}"
            )
        self._axes = tuple(range(x.ndim - k, x.ndim))
        self.remember_output_shape(x.shape)
        centred = x - x.mean(axis=self._axes, keepdims=True)
        var = np.square(centred).mean(axis=self._axes, keepdims=True)  # x.var's arithmetic, x − μ once
        self._inv_std = 1.0 / np.sqrt(var + self.eps)
        self._x_hat = centred
        self._x_hat *= self._inv_std
        if self.weight is None:
            return self._x_hat
        y = self._x_hat * self.weight.data
        y += self.bias.data
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape of x; returns dx, shape of x; adds dγ and dβ (normalized_shape)
        into weight.grad and bias.grad."""
        self.check_upstream(dy)
        g = dy
        if self.weight is not None:
            batch_axes = tuple(range(dy.ndim - len(self.normalized_shape)))
            self.weight.grad += (dy * self._x_hat).sum(axis=batch_axes)
            self.bias.grad += dy.sum(axis=batch_axes)
            g = dy * self.weight.data
        return _normalize_backward(g, self._x_hat, self._inv_std, self._axes)

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return _NORM_FLOPS_PER_ELEMENT * math.prod(input_shape)

    def __repr__(self) -> str:
        affine = self.weight is not None
        return f"LayerNorm({self.normalized_shape}, eps={self.eps}, elementwise_affine={affine})"


class GroupNorm(Module):
    """Split the C channels into num_groups groups; normalise each (sample, group) over its channels and
    spatial positions (torch.nn.GroupNorm). γ, β are per channel. Input (N, C, *)."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 *, dtype=np.float32):
        if not (is_count(num_groups) and is_count(num_channels)) or num_channels % num_groups:
            raise ValueError(f"GroupNorm needs num_channels ({num_channels}) divisible by num_groups "
                             f"({num_groups}), both integers >= 1")
        self.eps = check_eps(eps, type(self).__name__)
        self.num_groups, self.num_channels = int(num_groups), int(num_channels)
        self.weight = Parameter(np.ones(num_channels, dtype=dtype)) if affine else None
        self.bias = Parameter(np.zeros(num_channels, dtype=dtype)) if affine else None
        self._x_hat: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, shape (N, C, *); returns y, shape of x."""
        check_float_array(x, "GroupNorm input")
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"GroupNorm input: expected shape (N, {self.num_channels}, ...), got {x.shape}")
        self._shape = x.shape
        self.remember_output_shape(x.shape)
        grouped = x.reshape(x.shape[0], self.num_groups, -1)  # (N, G, C/G · spatial)
        mean, var = grouped.mean(axis=2, keepdims=True), grouped.var(axis=2, keepdims=True)
        self._inv_std = 1.0 / np.sqrt(var + self.eps)
        self._x_hat = ((grouped - mean) * self._inv_std).reshape(x.shape)
        if self.weight is None:
            return self._x_hat
        per_channel = (1, -1, *([1] * (x.ndim - 2)))
        return self._x_hat * self.weight.data.reshape(per_channel) + self.bias.data.reshape(per_channel)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape (N, C, *); returns dx, shape (N, C, *); adds dγ (C,) into
        weight.grad and dβ (C,) into bias.grad."""
        self.check_upstream(dy)
        g = dy
        if self.weight is not None:
            axes = (0, *range(2, dy.ndim))
            self.weight.grad += (dy * self._x_hat).sum(axis=axes)
            self.bias.grad += dy.sum(axis=axes)
            g = dy * self.weight.data.reshape(1, -1, *([1] * (dy.ndim - 2)))
        n = dy.shape[0]
        dx = _normalize_backward(
            g.reshape(n, self.num_groups, -1),
            self._x_hat.reshape(n, self.num_groups, -1),
            self._inv_std,
            axes=2,
        )
        return dx.reshape(self._shape)

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return _NORM_FLOPS_PER_ELEMENT * math.prod(input_shape)

    def __repr__(self) -> str:
        affine = self.weight is not None
        return f"GroupNorm({self.num_groups}, {self.num_channels}, eps={self.eps}, affine={affine})"
