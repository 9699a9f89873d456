"""Recurrent layers: the Elman RNN and the LSTM, one layer, backpropagation through time written out.

Shapes (torch.nn's names): x (T, N, input_size), or (N, T, input_size) with ``batch_first=True``;
weight_ih_l0 (G·H, input_size), weight_hh_l0 (G·H, H), bias_ih_l0 and bias_hh_l0 (G·H,), with G = 1 for
the RNN and G = 4 for the LSTM (gate order i, f, g, o, as torch). Output: every step's h, shape of x with
the last dimension H.

RNN:   h_t = tanh(x_t·W_ihᵀ + b_ih + h_(t−1)·W_hhᵀ + b_hh)                       (or relu)
LSTM:  [i, f, g, o] = x_t·W_ihᵀ + b_ih + h_(t−1)·W_hhᵀ + b_hh,  i, f, o = σ(·), g = tanh(·)
       c_t = f ⊙ c_(t−1) + i ⊙ g,   h_t = o ⊙ tanh(c_t)

Backward (BPTT) runs t = T−1 … 0 carrying dh (and dc) into the step before: the gate pre-activations'
gradient da_t of every step is collected, then dW_ih = Σ_t da_tᵀ·x_t, dW_hh = Σ_t da_tᵀ·h_(t−1),
dx_t = da_t·W_ih, dh_(t−1) = da_t·W_hh. Cost: forward 2·T·N·G·H·(I + H) FLOPs of matrix products,
backward twice that — and W_hh is read T times, once per step (the "Scaling Deep Learning" slides'
reason for persistent RNNs, see minidist.hardware.devices).

Unlike torch, ``forward`` returns only the output (every module here has one output); the final state is
kept as ``h_n`` (and ``c_n``), shape (1, N, H), and backward leaves the initial state's gradient in
``dh0`` (and ``dc0``).
"""

from __future__ import annotations

import numpy as np

from minidist.checks import check_count

from .module import Module, Parameter, check_float_array, resolve_rng


def sigmoid(a: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * a))        # = 1 / (1 + e^−a), without overflow for large |a|


def lstm_cell_forward(gates: np.ndarray, c_prev: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple]:
    """One LSTM step after the matrix products. gates: pre-activations (N, 4H) in order i, f, g, o;
    c_prev (N, H). Returns h (N, H), c (N, H) and the cache lstm_cell_backward needs."""
    i, f, g, o = np.split(gates, 4, axis=-1)
    i, f, g, o = sigmoid(i), sigmoid(f), np.tanh(g), sigmoid(o)
    c = f * c_prev + i * g
    tanh_c = np.tanh(c)
    return o * tanh_c, c, (i, f, g, o, c_prev, tanh_c)


def lstm_cell_backward(dh: np.ndarray, dc: np.ndarray, cache: tuple) -> tuple[np.ndarray, np.ndarray]:
    """dh, dc: gradients (N, H) reaching h_t and c_t (from the output and from step t+1).
    Returns (dgates (N, 4H) — the gradient of the pre-activations i, f, g, o —, dc_prev (N, H))."""
    i, f, g, o, c_prev, tanh_c = cache
    # BEGIN SOLUTION lstm_cell_backward
    do = dh * tanh_c
    dc = dc + dh * o * (1.0 - tanh_c ** 2)          # h = o·tanh(c) also depends on c
    di, df, dg = dc * g, dc * c_prev, dc * i
    dgates = np.concatenate([di * i * (1.0 - i), df * f * (1.0 - f), dg * (1.0 - g ** 2),
                             do * o * (1.0 - o)], axis=-1)
    return dgates, dc * f
    # END SOLUTION


class _Recurrent(Module):
    """What the RNN and the LSTM share: parameters, input checks, the layout of x, the weight gradients."""

    gates = 1

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, *, rng: np.random.Generator | None = None, dtype=np.float32):
        name = type(self).__name__
        check_count(input_size, f"{name} input_size"), check_count(hidden_size, f"{name} hidden_size")
        if check_count(num_layers, f"{name} num_layers") != 1:
            raise ValueError(f"{type(self).__name__}: only num_layers=1 is implemented (stack layers in a "
                             f"Sequential), got {num_layers}")
        rng = resolve_rng(rng)
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.batch_first = bool(batch_first)
        gh, bound = self.gates * self.hidden_size, 1.0 / np.sqrt(hidden_size)      # torch: U(−1/√H, 1/√H)
        self.weight_ih_l0 = Parameter(rng.uniform(-bound, bound, (gh, self.input_size)).astype(dtype))
        self.weight_hh_l0 = Parameter(rng.uniform(-bound, bound, (gh, self.hidden_size)).astype(dtype))
        self.bias_ih_l0 = Parameter(rng.uniform(-bound, bound, gh).astype(dtype)) if bias else None
        self.bias_hh_l0 = Parameter(rng.uniform(-bound, bound, gh).astype(dtype)) if bias else None
        self._x: np.ndarray | None = None

    def _time_major(self, x: np.ndarray) -> np.ndarray:
        """Check x and return it as (T, N, input_size)."""
        name = type(self).__name__
        check_float_array(x, f"{name} input", ndim=3)
        if x.shape[-1] != self.input_size:
            layout = "(N, T, input_size)" if self.batch_first else "(T, N, input_size)"
            raise ValueError(f"{name} expects input of shape {layout} with input_size={self.input_size}, "
                             f"got {x.shape}")
        if x.shape[1 if self.batch_first else 0] == 0:   # as torch: no final state without a step
            raise ValueError(f"{name} expects a sequence of at least one step, got input of shape {x.shape}")
        return x.transpose(1, 0, 2) if self.batch_first else x

    def _state(self, h: np.ndarray | None, n: int, dtype, what: str) -> np.ndarray:
        """An initial state (1, N, H) → (N, H); zeros when None."""
        if h is None:
            return np.zeros((n, self.hidden_size), dtype=dtype)
        check_float_array(h, f"{type(self).__name__} {what}", ndim=3)
        if h.shape != (1, n, self.hidden_size):
            raise ValueError(f"{type(self).__name__} expects {what} of shape {(1, n, self.hidden_size)}, "
                             f"got {h.shape}")
        return h[0]

    def _input_projection(self, x: np.ndarray) -> np.ndarray:
        """x_t·W_ihᵀ + b_ih + b_hh for all steps at once: (T, N, G·H) — it does not depend on h."""
        a = x @ self.weight_ih_l0.data.T
        if self.bias_ih_l0 is not None:
            a = a + self.bias_ih_l0.data + self.bias_hh_l0.data
        return a

    def _output(self, hs: np.ndarray) -> np.ndarray:
        y = hs.transpose(1, 0, 2) if self.batch_first else hs
        self.remember_output_shape(y.shape)
        return np.ascontiguousarray(y)

    def _weight_grads(self, da: np.ndarray, h_prev: np.ndarray) -> np.ndarray:
        """Add the parameter gradients from every step's da (T, N, G·H); return dx in x's layout."""
        self.weight_ih_l0.grad += np.einsum("tng,tni->gi", da, self._x)
        self.weight_hh_l0.grad += np.einsum("tng,tnh->gh", da, h_prev)
        if self.bias_ih_l0 is not None:
            self.bias_ih_l0.grad += da.sum(axis=(0, 1))
            self.bias_hh_l0.grad += da.sum(axis=(0, 1))
        dx = da @ self.weight_ih_l0.data
        return dx.transpose(1, 0, 2) if self.batch_first else dx

    def _dy_time_major(self, dy: np.ndarray) -> np.ndarray:
        self.check_upstream(dy)
        return dy.transpose(1, 0, 2) if self.batch_first else dy

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """Forward FLOPs of the matrix products, 2·T·N·G·H·(input_size + H) (gates' pointwise work not
        counted); backward costs twice that."""
        if len(input_shape) != 3 or input_shape[-1] != self.input_size:
            raise ValueError(f"{type(self).__name__}.flops expects a 3-D input shape ending in "
                             f"{self.input_size}, got {tuple(input_shape)}")
        t, n = input_shape[0], input_shape[1]
        return 2 * t * n * self.gates * self.hidden_size * (self.input_size + self.hidden_size)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.input_size}, {self.hidden_size}, "
                f"bias={self.bias_ih_l0 is not None}, batch_first={self.batch_first})")


class RNN(_Recurrent):
    """Elman RNN, h_t = tanh(x_t·W_ihᵀ + b_ih + h_(t−1)·W_hhᵀ + b_hh) (nonlinearity "tanh" or "relu")."""

    gates = 1

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, *, rng: np.random.Generator | None = None,
                 dtype=np.float32):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, rng=rng, dtype=dtype)
        self.nonlinearity = nonlinearity

    def forward(self, x: np.ndarray, h0: np.ndarray | None = None) -> np.ndarray:
        """x (T, N, I) (or (N, T, I) batch_first), h0 (1, N, H) or None → output (T, N, H) (or (N, T, H));
        the last state is kept in h_n (1, N, H)."""
        xt = self._time_major(x)
        h = self._state(h0, xt.shape[1], xt.dtype, "h0")
        self._x, self._h0 = xt, h
        a_in = self._input_projection(xt)
        hs = np.empty(a_in.shape, dtype=np.result_type(a_in, h))
        for t in range(xt.shape[0]):
            a = a_in[t] + h @ self.weight_hh_l0.data.T
            h = np.tanh(a) if self.nonlinearity == "tanh" else np.maximum(a, 0)
            hs[t] = h
        self._hs = hs
        self.h_n = hs[-1:].copy()
        return self._output(hs)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy (shape of the output) → dx (shape of x); adds into every parameter's grad; leaves dh0."""
        dy = self._dy_time_major(dy)
        hs = self._hs
        da = np.empty_like(hs)
        dh_next = np.zeros_like(hs[0])
        for t in reversed(range(hs.shape[0])):
            dh = dy[t] + dh_next                                   # from the output and from step t+1
            da[t] = dh * (1.0 - hs[t] ** 2) if self.nonlinearity == "tanh" else dh * (hs[t] > 0)
            dh_next = da[t] @ self.weight_hh_l0.data
        self.dh0 = dh_next[None]
        return self._weight_grads(da, np.concatenate([self._h0[None], hs[:-1]]))


class LSTM(_Recurrent):
    """Long short-term memory (Hochreiter and Schmidhuber 1997) with torch's gate order i, f, g, o."""

    gates = 4

    def forward(self, x: np.ndarray, hx: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """x (T, N, I) (or (N, T, I) batch_first), hx = (h0, c0) each (1, N, H), or None → output
        (T, N, H) (or (N, T, H)); the last states are kept in h_n and c_n (1, N, H)."""
        xt = self._time_major(x)
        if hx is not None and (not isinstance(hx, tuple) or len(hx) != 2):
            raise TypeError("LSTM expects hx = (h0, c0) or None")
        h0, c0 = hx if hx is not None else (None, None)
        h, c = self._state(h0, xt.shape[1], xt.dtype, "h0"), self._state(c0, xt.shape[1], xt.dtype, "c0")
        self._x, self._h0 = xt, h
        a_in = self._input_projection(xt)
        hs = np.empty(a_in.shape[:2] + (self.hidden_size,), dtype=np.result_type(a_in, h))
        self._caches = []
        for t in range(xt.shape[0]):
            h, c, cache = lstm_cell_forward(a_in[t] + h @ self.weight_hh_l0.data.T, c)
            hs[t] = h
            self._caches.append(cache)
        self._hs = hs
        self.h_n, self.c_n = hs[-1:].copy(), c[None].copy()
        return self._output(hs)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy (shape of the output) → dx (shape of x); adds into every parameter's grad; leaves dh0, dc0."""
        dy = self._dy_time_major(dy)
        steps = dy.shape[0]
        da = np.empty(dy.shape[:2] + (4 * self.hidden_size,), dtype=self._hs.dtype)
        dh_next, dc = np.zeros_like(self._hs[0]), np.zeros_like(self._hs[0])
        for t in reversed(range(steps)):
            da[t], dc = lstm_cell_backward(dy[t] + dh_next, dc, self._caches[t])
            dh_next = da[t] @ self.weight_hh_l0.data
        self.dh0, self.dc0 = dh_next[None], dc[None]
        return self._weight_grads(da, np.concatenate([self._h0[None], self._hs[:-1]]))
