"""Recurrent layers: the Elman RNN and the LSTM (the GRU: gru.py), stacked num_layers deep,
backpropagation through time written out.

Shapes (torch.nn's names): x (T, N, input_size), or (N, T, input_size) with ``batch_first=True``; for
layer k, weight_ih_lk (G·H, I_k) with I_0 = input_size and I_k = H above, weight_hh_lk (G·H, H),
bias_ih_lk and bias_hh_lk (G·H,); G = 1 for the RNN, 4 for the LSTM (gate order i, f, g, o, as torch),
3 for the GRU. Layer k's outputs are layer k+1's inputs.

RNN:   h_t = tanh(x_t·W_ihᵀ + b_ih + h_(t−1)·W_hhᵀ + b_hh)                       (or relu)
LSTM:  [i, f, g, o] = x_t·W_ihᵀ + b_ih + h_(t−1)·W_hhᵀ + b_hh,  i, f, o = σ(·), g = tanh(·)
       c_t = f ⊙ c_(t−1) + i ⊙ g,   h_t = o ⊙ tanh(c_t)

Backward (BPTT) runs t = T−1 … 0 carrying dh (and dc) into the step before: the gate pre-activations'
gradient da_t of every step is collected, then dW_ih = Σ_t da_tᵀ·x_t, dW_hh = Σ_t da_tᵀ·h_(t−1),
dx_t = da_t·W_ih, dh_(t−1) = da_t·W_hh. Cost: forward 2·T·N·G·H·(I + H) FLOPs of matrix products,
backward twice that — and W_hh is read T times, once per step (the "Scaling Deep Learning" slides'
reason for persistent RNNs, see minidist.hardware.devices).

As torch: ``forward(x, h0)`` returns ``(output, h_n)`` — output (T, N, H) (the last layer's h at every
step), h_n (num_layers, N, H) (every layer's last h); the LSTM takes and returns (h, c) pairs.
``backward(d_output, dh_n=None)`` (LSTM: ``dh_n, dc_n``) takes the gradients of both outputs, returns dx
and leaves the initial states' gradients in ``dh0`` (and ``dc0``), (num_layers, N, H).
"""

from __future__ import annotations

import numpy as np

from minidist.nn.checks import check_count

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
    """What the RNN, LSTM and GRU share: the stacked parameters, input and state checks, the layout of x,
    the layer-by-layer forward and backward around each kind's own time loop (_forward_layer,
    _backward_layer)."""

    gates = 1

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, *, rng: np.random.Generator | None = None, dtype=np.float32):
        name = type(self).__name__
        self.input_size = check_count(input_size, f"{name}: input_size")
        self.hidden_size = check_count(hidden_size, f"{name}: hidden_size")
        self.num_layers = check_count(num_layers, f"{name}: num_layers")
        rng = resolve_rng(rng)
        self.batch_first, self.bias = bool(batch_first), bool(bias)
        gh, bound = self.gates * self.hidden_size, 1.0 / np.sqrt(hidden_size)      # torch: U(−1/√H, 1/√H)
        for k in range(self.num_layers):
            width = self.input_size if k == 0 else self.hidden_size
            for name, shape in (("weight_ih", (gh, width)), ("weight_hh", (gh, self.hidden_size)),
                                ("bias_ih", (gh,)), ("bias_hh", (gh,))):
                value = rng.uniform(-bound, bound, shape).astype(dtype) if bias or "weight" in name else None
                setattr(self, f"{name}_l{k}", None if value is None else Parameter(value))
        self._inputs: list | None = None

    def weights(self, k: int) -> tuple:
        """Layer k's (weight_ih, weight_hh, bias_ih, bias_hh) Parameters (biases None without bias)."""
        kinds = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        return tuple(getattr(self, f"{kind}_l{k}") for kind in kinds)

    def _time_major(self, x: np.ndarray) -> np.ndarray:
        """Check x and return it as (T, N, input_size)."""
        name = type(self).__name__
        check_float_array(x, f"{name} input", ndim=3)
        if x.shape[-1] != self.input_size:
            layout = "(N, T, input_size)" if self.batch_first else "(T, N, input_size)"
            raise ValueError(f"{name} expects input of shape {layout} with input_size={self.input_size}, "
                             f"got {x.shape}")
        xt = x.transpose(1, 0, 2) if self.batch_first else x
        if xt.shape[0] == 0:
            raise ValueError(f"{name} needs a sequence of at least one step, got shape {x.shape}")
        return xt

    def _state(self, h: np.ndarray | None, n: int, dtype, what: str) -> np.ndarray:
        """An initial state or a final state's gradient (num_layers, N, H); zeros when None."""
        shape = (self.num_layers, n, self.hidden_size)
        if h is None:
            return np.zeros(shape, dtype=dtype)
        check_float_array(h, f"{type(self).__name__} {what}", ndim=3)
        if h.shape != shape:
            raise ValueError(f"{type(self).__name__} expects {what} of shape {shape}, got {h.shape}")
        return h

    def _input_projection(self, k: int, x: np.ndarray) -> np.ndarray:
        """x_t·W_ihᵀ + b_ih + b_hh for all steps of layer k at once: (T, N, G·H) — it does not depend on h."""
        w_ih, _, b_ih, b_hh = self.weights(k)
        a = x @ w_ih.data.T
        return a if b_ih is None else a + b_ih.data + b_hh.data

    def _run_layers(self, xt: np.ndarray, *states: np.ndarray) -> np.ndarray:
        """Every layer's forward in turn; states: per kind, arrays (num_layers, N, H). Keeps each layer's
        input, output and final states; returns the last layer's output (T, N, H)."""
        self._inputs, self._outputs, self._finals, self._initials = [], [], [], states
        self._caches = {}                              # per layer: what a kind's time loop keeps for backward
        layer_in = xt
        for k in range(self.num_layers):
            hs, finals = self._forward_layer(k, layer_in, *(s[k] for s in states))
            self._inputs.append(layer_in)
            self._outputs.append(hs)
            self._finals.append(finals)
            layer_in = hs
        y = layer_in.transpose(1, 0, 2) if self.batch_first else layer_in
        self.remember_output_shape(y.shape)
        return np.ascontiguousarray(y)

    def forward(self, x: np.ndarray, h0: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The one-state kinds (RNN, GRU): x (T, N, I) (or (N, T, I) batch_first), h0 (num_layers, N, H) or
        None → (output (T, N, H) (or (N, T, H)), h_n (num_layers, N, H)). The LSTM takes and returns pairs."""
        xt = self._time_major(x)
        y = self._run_layers(xt, self._state(h0, xt.shape[1], xt.dtype, "h0"))
        (self.h_n,) = self._final_states()
        return y, self.h_n.copy()

    def backward(self, dy: np.ndarray, dh_n: np.ndarray | None = None) -> np.ndarray:
        """dy (shape of the output), dh_n (num_layers, N, H) or None → dx (shape of x); adds into every
        parameter's grad; leaves dh0 (num_layers, N, H)."""
        dx, (self.dh0,) = self._back_layers(dy, dh_n=dh_n)
        return dx

    def _previous_states(self, k: int) -> np.ndarray:
        """h_(t−1) of layer k at every step (T, N, H): its initial state, then its outputs but the last."""
        return np.concatenate([self._initials[0][k][None], self._outputs[k][:-1]])

    def _final_states(self) -> list[np.ndarray]:
        """Per state kind, (num_layers, N, H): every layer's last state."""
        return [np.stack([finals[i] for finals in self._finals]) for i in range(len(self._finals[0]))]

    def _back_layers(self, dy: np.ndarray, **d_finals: np.ndarray | None) -> tuple[np.ndarray, list]:
        """dy: gradient of the output (its layout); d_finals: per state kind, by name (dh_n, dc_n), the
        gradient of the final states (num_layers, N, H) or None. Runs every layer's backward, last first;
        returns dx (x's layout) and the initial states' gradients."""
        self.check_upstream(dy)                        # before anything changes
        if self._inputs is None:
            raise RuntimeError(f"{type(self).__name__}.backward called twice for one forward")
        n = self._outputs[0].shape[1]
        finals = [self._state(value, n, dy.dtype, name) for name, value in d_finals.items()]
        d = dy.transpose(1, 0, 2) if self.batch_first else dy
        d_initial = [np.empty_like(s) for s in finals]
        for k in reversed(range(self.num_layers)):
            d, d0 = self._backward_layer(k, d, *(s[k] for s in finals))
            for i, value in enumerate(d0):
                d_initial[i][k] = value
        self._inputs = None
        return (d.transpose(1, 0, 2) if self.batch_first else d), d_initial

    def _add_gradients(self, k: int, d_ih: np.ndarray, d_hh: np.ndarray, h_prev: np.ndarray) -> np.ndarray:
        """Add layer k's parameter gradients from every step's d(pre-activations) (T, N, G·H) on the input
        side (d_ih) and the recurrent side (d_hh); return the gradient of the layer's input (T, N, I_k)."""
        w_ih, w_hh, b_ih, b_hh = self.weights(k)
        w_ih.grad += np.einsum("tng,tni->gi", d_ih, self._inputs[k])
        w_hh.grad += np.einsum("tng,tnh->gh", d_hh, h_prev)
        if b_ih is not None:
            b_ih.grad += d_ih.sum(axis=(0, 1))
            b_hh.grad += d_hh.sum(axis=(0, 1))
        return d_ih @ w_ih.data

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """Forward FLOPs of the matrix products, Σ_k 2·T·N·G·H·(I_k + H) (gates' pointwise work not
        counted); backward costs twice that."""
        if len(input_shape) != 3 or input_shape[-1] != self.input_size:
            raise ValueError(f"{type(self).__name__}.flops expects a 3-D input shape ending in "
                             f"{self.input_size}, got {tuple(input_shape)}")
        t, n, h = input_shape[0], input_shape[1], self.hidden_size
        widths = [self.input_size] + [h] * (self.num_layers - 1)
        return sum(2 * t * n * self.gates * h * (width + h) for width in widths)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
                f"bias={self.bias}, batch_first={self.batch_first})")


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

    def _forward_layer(self, k: int, x: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, tuple]:
        a_in, w_hh = self._input_projection(k, x), self.weights(k)[1].data
        hs = np.empty(a_in.shape, dtype=np.result_type(a_in, h))
        for t in range(x.shape[0]):
            a = a_in[t] + h @ w_hh.T
            h = np.tanh(a) if self.nonlinearity == "tanh" else np.maximum(a, 0)
            hs[t] = h
        return hs, (h,)

    def _backward_layer(self, k: int, dy: np.ndarray, dh_next: np.ndarray) -> tuple[np.ndarray, tuple]:
        hs, w_hh = self._outputs[k], self.weights(k)[1].data
        da = np.empty_like(hs)
        for t in reversed(range(hs.shape[0])):
            dh = dy[t] + dh_next                                   # from the output and from step t+1
            da[t] = dh * (1.0 - hs[t] ** 2) if self.nonlinearity == "tanh" else dh * (hs[t] > 0)
            dh_next = da[t] @ w_hh
        return self._add_gradients(k, da, da, self._previous_states(k)), (dh_next,)


class LSTM(_Recurrent):
    """Long short-term memory (Hochreiter and Schmidhuber 1997) with torch's gate order i, f, g, o."""

    gates = 4

    def forward(self, x: np.ndarray, hx: tuple[np.ndarray, np.ndarray] | None = None) -> tuple:
        """x (T, N, I) (or (N, T, I) batch_first), hx = (h0, c0) each (num_layers, N, H), or None →
        (output (T, N, H) (or (N, T, H)), (h_n, c_n) each (num_layers, N, H))."""
        xt = self._time_major(x)
        if hx is not None and (not isinstance(hx, tuple) or len(hx) != 2):
            raise TypeError("LSTM expects hx = (h0, c0) or None")
        h0, c0 = hx if hx is not None else (None, None)
        n = xt.shape[1]
        y = self._run_layers(xt, self._state(h0, n, xt.dtype, "h0"), self._state(c0, n, xt.dtype, "c0"))
        self.h_n, self.c_n = self._final_states()
        return y, (self.h_n.copy(), self.c_n.copy())

    def _forward_layer(self, k: int, x: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, tuple]:
        a_in, w_hh = self._input_projection(k, x), self.weights(k)[1].data
        hs = np.empty(a_in.shape[:2] + (self.hidden_size,), dtype=np.result_type(a_in, h))
        caches = []
        for t in range(x.shape[0]):
            h, c, cache = lstm_cell_forward(a_in[t] + h @ w_hh.T, c)
            hs[t] = h
            caches.append(cache)
        self._caches[k] = caches
        return hs, (h, c)

    def backward(self, dy: np.ndarray, dh_n: np.ndarray | None = None, dc_n: np.ndarray | None = None):
        """dy (shape of the output), dh_n and dc_n (num_layers, N, H) or None → dx (shape of x); adds into
        every parameter's grad; leaves dh0 and dc0 (num_layers, N, H)."""
        dx, (self.dh0, self.dc0) = self._back_layers(dy, dh_n=dh_n, dc_n=dc_n)
        return dx

    def _backward_layer(self, k: int, dy: np.ndarray, dh_next: np.ndarray, dc: np.ndarray) -> tuple:
        hs, w_hh, caches = self._outputs[k], self.weights(k)[1].data, self._caches[k]
        da = np.empty(dy.shape[:2] + (4 * self.hidden_size,), dtype=hs.dtype)
        for t in reversed(range(dy.shape[0])):
            da[t], dc = lstm_cell_backward(dy[t] + dh_next, dc, caches[t])
            dh_next = da[t] @ w_hh
        return self._add_gradients(k, da, da, self._previous_states(k)), (dh_next, dc)
