"""Element-wise activations and dropout. Each keeps what its derivative needs and nothing more.

ReLU:     y = max(x, 0)                         dx = dy · [x > 0]
Tanh:     y = tanh(x)                           dx = dy · (1 − y²)
Sigmoid:  y = σ(x) = 1 / (1 + e^(−x))           dx = dy · y · (1 − y)
GELU:     y = x · Φ(x) = x/2 · (1 + erf(x/√2))  dx = dy · (Φ(x) + x · φ(x)),  φ(x) = e^(−x²/2) / √(2π)
          approximate="tanh":  y = x/2 · (1 + tanh(u)),  u = √(2/π) · (x + 0.044715 x³)
                               dx = dy · (½(1 + t) + ½ x (1 − t²) · √(2/π) (1 + 3·0.044715 x²)),  t = tanh(u)
Dropout:  training: y = x · m / (1 − p), m_i ~ Bernoulli(1 − p) drawn from the layer's rng
          ("inverted" dropout: the expectation of y is x, so eval is the identity)
                                                dx = dy · m / (1 − p)

GELU's Φ in float32 (and float16) is Abramowitz & Stegun's 7.1.26 (|error of erf| <= 1.5e-7, about one
float32 step of 1) in NumPy passes: scipy's erf has no vectorised float32 loop and cost 5× the whole
GELU (issue 59). float64 keeps scipy's erf, so the float64 gradient checks see the exact function.

``flops(input_shape)`` counts the arithmetic per element (exp, tanh and erf count as one each): these
layers are cheap next to the matrix products and limited by memory traffic, not FLOPs.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf  # scipy comes with scikit-learn, a dependency; NumPy has no erf

from .module import Module, check_float_array, resolve_rng

# Abramowitz & Stegun 7.1.26: erf(z) ≈ 1 − t·(a1 + t·(a2 + … + t·a5))·e^(−z²), t = 1 / (1 + p·z), z >= 0
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def normal_cdf(x: np.ndarray) -> np.ndarray:
    """Φ(x) = ½ (1 + erf(x / √2)), x's shape and dtype. float64: scipy's erf; float32/float16: 7.1.26 in
    float32, q = Φ(−|x|) = ½ t·poly(t)·e^(−x²/2) with t = 1 / (1 + p·|x|/√2), then Φ(x) = ½ + sign(x)·(½ − q)
    (|error| <= 3e-7). One NumPy pass per operation, in place; a sign bit, not np.where: a data-dependent
    select of random signs runs 10-20× slower than the arithmetic."""
    if x.dtype == np.float64:
        return 0.5 * (1 + erf(x / math.sqrt(2)))
    x32 = x.astype(np.float32, copy=False)
    t = np.abs(x32)
    t *= np.float32(_AS_P / math.sqrt(2))
    t += 1
    np.reciprocal(t, out=t)
    q = t * np.float32(_AS_A[-1] / 2)
    for a in _AS_A[-2::-1]:          # Horner, in place: q = (a + t·q)/2·…, the ½ folded into the a's
        q += np.float32(a / 2)
        q *= t
    gauss = np.square(x32)
    gauss *= np.float32(-0.5)
    q *= np.exp(gauss, out=gauss)    # q = Φ(−|x|)
    np.subtract(np.float32(0.5), q, out=q)   # ½ − q >= 0: copy x's sign bit onto it (np.copysign, but
    bits = q.view(np.int32)                  # vectorised: copysign has no SIMD loop and cost 6× this)
    bits |= x32.view(np.int32) & np.int32(-2**31)
    q += np.float32(0.5)
    return q.astype(x.dtype, copy=False)


class _Elementwise(Module):
    flops_per_element = 1

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return self.flops_per_element * math.prod(input_shape)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ReLU(_Elementwise):
    flops_per_element = 1  # one comparison

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, any shape; returns y, shape of x."""
        check_float_array(x, "ReLU input")
        self._mask = x > 0  # a boolean per element: 1 byte, not a copy of x
        self.remember_output_shape(x.shape)
        return np.maximum(x, 0)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape of x; returns dx = dy · [x > 0], shape of x."""
        self.check_upstream(dy)
        return dy * self._mask  # (np.where(mask, dy, 0) says the same, an order of magnitude slower)


class Tanh(_Elementwise):
    flops_per_element = 1

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, any shape; returns y, shape of x."""
        check_float_array(x, "Tanh input")
        self._y = np.tanh(x)  # the derivative needs only the output
        self.remember_output_shape(x.shape)
        return self._y

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape of x; returns dx = dy · (1 − y²), shape of x."""
        self.check_upstream(dy)
        return dy * (1 - self._y * self._y)


class Sigmoid(_Elementwise):
    flops_per_element = 3  # exp, add, divide

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, any shape; returns y, shape of x."""
        check_float_array(x, "Sigmoid input")
        # e^(−|x|) never overflows: σ(x) = 1/(1 + e) for x >= 0 and e/(1 + e) for x < 0
        e = np.exp(-np.abs(x))
        self._y = np.where(x >= 0, 1, e) / (1 + e)
        self.remember_output_shape(x.shape)
        return self._y

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape of x; returns dx = dy · y · (1 − y), shape of x."""
        self.check_upstream(dy)
        return dy * self._y * (1 - self._y)


class GELU(_Elementwise):
    """Gaussian error linear unit (torch.nn.GELU): exact erf form, or approximate="tanh"."""

    def __init__(self, approximate: str = "none"):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate
        self.flops_per_element = 5 if approximate == "none" else 9

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, any shape; returns y, shape of x."""
        check_float_array(x, "GELU input")
        self._x = x
        self.remember_output_shape(x.shape)
        if self.approximate == "tanh":
            self._t = np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))
            return 0.5 * x * (1 + self._t)
        self._cdf = normal_cdf(x)  # Φ(x) = ½ (1 + erf(x/√2))
        return x * self._cdf

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape of x; returns dx, shape of x (formula in the module docstring)."""
        self.check_upstream(dy)
        x = self._x
        if self.approximate == "tanh":
            t = self._t
            du = math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x * x)
            return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du)
        pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)  # φ(x)
        return dy * (self._cdf + x * pdf)

    def __repr__(self) -> str:
        return f"GELU(approximate={self.approximate!r})"


class Dropout(_Elementwise):
    """Inverted dropout (torch.nn.Dropout): zero each element with probability p in training, scale the
    rest by 1/(1 − p); the identity in eval mode. The mask comes from ``rng`` (set ``layer.rng`` to a
    fresh generator to replay a mask)."""

    flops_per_element = 1  # one multiplication by m / (1 − p)

    def __init__(self, p: float = 0.5, *, rng: np.random.Generator | None = None):
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"Dropout probability must lie in [0, 1], got {p}")
        self.p = float(p)
        self.rng = resolve_rng(rng)
        self._scaled_mask: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, any shape; returns y, shape of x."""
        check_float_array(x, "Dropout input")
        self.remember_output_shape(x.shape)
        if not self.training or self.p == 0.0:
            self._scaled_mask = None
            return x
        keep = self.rng.random(x.shape) >= self.p
        scale = 0.0 if self.p == 1.0 else 1.0 / (1.0 - self.p)
        self._scaled_mask = (keep * scale).astype(x.dtype)  # m / (1 − p): all backward needs
        return x * self._scaled_mask

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape of x; returns dx = dy · m / (1 − p) (dy itself in eval),
        shape of x."""
        self.check_upstream(dy)
        return dy if self._scaled_mask is None else dy * self._scaled_mask

    def __repr__(self) -> str:
        return f"Dropout(p={self.p})"
