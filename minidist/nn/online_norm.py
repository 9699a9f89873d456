"""Online Normalization (Chiley et al., "Online Normalization for Training Neural Networks", NeurIPS 2019).

The "Hardware Accelerators for Training Deep Neural Networks" slides ("Online Normalization Properties"):
normalise each sample with running estimates of the mean and variance instead of batch statistics, so
any batch size works, 1 included. Per channel, samples t = 1, 2, ... in order (m_t, v_t: the mean and
variance of sample t over its spatial positions; for (N, C) inputs m_t = x_t and v_t = 0):

    forward:   y_t = (x_t − μ_{t−1}) / s_{t−1},     s_{t−1} = √(σ²_{t−1} + ε)
               σ²_t = αf σ²_{t−1} + (1 − αf) v_t + αf (1 − αf) (m_t − μ_{t−1})²
               μ_t  = αf μ_{t−1} + (1 − αf) m_t
    backward:  g̃_t = g_t − (1 − αb) ε⁽ʸ⁾_{t−1} y_t,    ε⁽ʸ⁾_t = ε⁽ʸ⁾_{t−1} + mean_spatial(g̃_t · y_t)
               dx_t = g̃_t / s_{t−1} − (1 − αb) ε⁽¹⁾_{t−1},   ε⁽¹⁾_t = ε⁽¹⁾_{t−1} + mean_spatial(dx_t)
    (g = dy · γ; then z = γ y + β, dγ = Σ dy · y, dβ = Σ dy.)

The gradient treats (μ_{t−1}, s_{t−1}) as constants, as the paper defines it; what batch norm's two
extra backward terms do (make dx orthogonal to 1 and to y) is done here in the long run by the two error
accumulators ε⁽ʸ⁾ (``v_ctrl``) and ε⁽¹⁾ (``u_ctrl``), which feed back every deviation from
orthogonality, with decay αb. With αb = 1 the corrections vanish and dx = g / s. Eval mode uses the
running estimates and no corrections. Properties (tested): output asymptotically zero mean and unit
variance on a stationary input; bounded gradients; bounded accumulated errors.
"""

from __future__ import annotations

import math

import numpy as np

from minidist.nn.checks import check_count, check_eps

from .module import Module, Parameter, check_float_array


class OnlineNorm(Module):
    """Online Normalization of (N, C) or (N, C, *) inputs, per channel, samples taken in batch order.

    num_features: C. alpha_fwd: αf in [0, 1), the decay of the running mean/variance. alpha_bkw: αb in
    [0, 1], the decay of the backward's error feedback. eps > 0. affine: learnable γ, β of shape (C,).
    Buffers: running_mean, running_var (μ, σ²), u_ctrl (ε⁽¹⁾), v_ctrl (ε⁽ʸ⁾), all (C,).
    """

    def __init__(
        self,
        num_features: int,
        alpha_fwd: float = 0.999,
        alpha_bkw: float = 0.99,
        eps: float = 1e-5,
        affine: bool = True,
        *,
        dtype=np.float32,
    ):
        check_count(num_features, "OnlineNorm: num_features")
        self.eps = check_eps(eps, "OnlineNorm")
        if not (0.0 <= alpha_fwd < 1.0 and 0.0 <= alpha_bkw <= 1.0):
            raise ValueError(f"OnlineNorm needs 0 <= alpha_fwd < 1 and 0 <= alpha_bkw <= 1, got "
                             f"alpha_fwd={alpha_fwd}, alpha_bkw={alpha_bkw}")
        self.num_features = int(num_features)
        self.alpha_fwd, self.alpha_bkw = float(alpha_fwd), float(alpha_bkw)
        self.weight = Parameter(np.ones(num_features, dtype=dtype)) if affine else None
        self.bias = Parameter(np.zeros(num_features, dtype=dtype)) if affine else None
        for name, value in (("running_mean", 0.0), ("running_var", 1.0), ("u_ctrl", 0.0), ("v_ctrl", 0.0)):
            self.register_buffer(name, np.full(num_features, value, dtype=dtype))
        self._y: np.ndarray | None = None

    def _per_channel(self, v: np.ndarray, ndim: int) -> np.ndarray:
        return v.reshape(*v.shape[:-1], self.num_features, *([1] * (ndim - 2)))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, shape (N, C) or (N, C, *), N ≥ 1; returns z = γ y + β, shape of x. In training mode the
        running estimates advance by N samples."""
        check_float_array(x, "OnlineNorm input")
        if x.ndim < 2 or x.shape[1] != self.num_features or x.shape[0] < 1:
            raise ValueError(
                f"OnlineNorm input: expected shape (N >= 1, {self.num_features}, ...), got {x.shape}"
            )
        self.remember_output_shape(x.shape)
        spatial = tuple(range(2, x.ndim))
        self._spatial = spatial
        self._training_forward = self.training
        if self.training:
            a = self.alpha_fwd
            sample_mean, sample_var = x.mean(axis=spatial), x.var(axis=spatial)   # (N, C)
            centers, scales = np.empty_like(sample_mean), np.empty_like(sample_mean)
            mu, var = self.running_mean.astype(x.dtype), self.running_var.astype(x.dtype)
            for t in range(x.shape[0]):         # one sample after the other, as the stream arrives
                centers[t], scales[t] = mu, np.sqrt(var + self.eps)
                deviation = sample_mean[t] - mu
                var = a * var + (1 - a) * sample_var[t] + a * (1 - a) * deviation ** 2
                mu = mu + (1 - a) * deviation
            self.running_mean[...], self.running_var[...] = mu, var
        else:
            centers = np.broadcast_to(self.running_mean.astype(x.dtype), x.shape[:2])
            scales = np.broadcast_to(np.sqrt(self.running_var.astype(x.dtype) + self.eps), x.shape[:2])
        self._scales = self._per_channel(scales, x.ndim)                         # (N, C, 1, ...)
        self._y = (x - self._per_channel(centers, x.ndim)) / self._scales
        if self.weight is None:
            return self._y
        return self._y * self._per_channel(self.weight.data, x.ndim) + self._per_channel(
            self.bias.data, x.ndim
        )

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape of x; returns dx, shape of x; adds dγ, dβ (C,) into weight.grad,
        bias.grad. In training mode the error accumulators u_ctrl, v_ctrl advance by N samples."""
        self.check_upstream(dy)
        y, axes = self._y, (0, *self._spatial)
        g = dy
        if self.weight is not None:
            self.weight.grad += (dy * y).sum(axis=axes)
            self.bias.grad += dy.sum(axis=axes)
            g = dy * self._per_channel(self.weight.data, dy.ndim)
        if not self._training_forward:
            return g / self._scales
        c = 1.0 - self.alpha_bkw
        u, v = self.u_ctrl.astype(dy.dtype), self.v_ctrl.astype(dy.dtype)
        dx = np.empty_like(g)
        one = (1, *([1] * len(self._spatial)))
        for t in range(dy.shape[0]):
            g_t = g[t] - c * v.reshape(-1, *one[1:]) * y[t]                       # remove the y-component
            v = v + (g_t * y[t]).reshape(self.num_features, -1).mean(axis=1)
            dx[t] = g_t / self._scales[t] - c * u.reshape(-1, *one[1:])           # remove the mean
            u = u + dx[t].reshape(self.num_features, -1).mean(axis=1)
        self.u_ctrl[...], self.v_ctrl[...] = u, v
        return dx

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return 12 * math.prod(input_shape)

    def __repr__(self) -> str:
        return (f"OnlineNorm({self.num_features}, alpha_fwd={self.alpha_fwd}, alpha_bkw={self.alpha_bkw}, "
                f"eps={self.eps}, affine={self.weight is not None})")
