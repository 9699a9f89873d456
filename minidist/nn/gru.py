"""The gated recurrent unit (Cho et al. 2014), torch.nn.GRU's equations and gate order r, z, n:

    r = σ(x·W_irᵀ + b_ir + h·W_hrᵀ + b_hr)          reset gate
    z = σ(x·W_izᵀ + b_iz + h·W_hzᵀ + b_hz)          update gate
    n = tanh(x·W_inᵀ + b_in + r ⊙ (h·W_hnᵀ + b_hn))  candidate: the reset gate scales the recurrent part only
    h' = (1 − z) ⊙ n + z ⊙ h

Because r multiplies (h·W_hnᵀ + b_hn), b_hn cannot be folded into b_in (the RNN and LSTM fold b_hh into
b_ih): the input side a_i = x·W_ihᵀ + b_ih and the recurrent side a_h = h·W_hhᵀ + b_hh are kept apart,
and so are their gradients. Backward of one step, from dh' (the output's and the next step's):

    dn = dh' ⊙ (1 − z),  dz = dh' ⊙ (h − n),  dh = dh' ⊙ z + da_h·W_hh
    da_n = dn ⊙ (1 − n²);  dr = da_n ⊙ (h·W_hnᵀ + b_hn)
    da_i = [dr ⊙ r(1 − r), dz ⊙ z(1 − z), da_n],   da_h = [dr ⊙ r(1 − r), dz ⊙ z(1 − z), da_n ⊙ r]

Stacking, shapes, (output, h_n) and backward(dy, dh_n): as the RNN's (rnn.py).
"""

from __future__ import annotations

import numpy as np

from .rnn import _Recurrent, sigmoid


def gru_cell_forward(a_i: np.ndarray, a_h: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, tuple]:
    """One step: a_i = x·W_ihᵀ + b_ih and a_h = h·W_hhᵀ + b_hh, each (N, 3H) in gate order r, z, n;
    h (N, H). Returns h' (N, H) and the cache gru_cell_backward needs."""
    i_r, i_z, i_n = np.split(a_i, 3, axis=-1)
    h_r, h_z, h_n = np.split(a_h, 3, axis=-1)
    r, z = sigmoid(i_r + h_r), sigmoid(i_z + h_z)
    n = np.tanh(i_n + r * h_n)
    return (1.0 - z) * n + z * h, (r, z, n, h_n, h)


def gru_cell_backward(dh_new: np.ndarray, cache: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dh_new (N, H): the gradient reaching h'. Returns (da_i, da_h) each (N, 3H) and the part of dh
    (N, H) that flows directly through z ⊙ h (the caller adds da_h·W_hh)."""
    r, z, n, h_n, h = cache
    dn, dz = dh_new * (1.0 - z), dh_new * (h - n)
    da_n = dn * (1.0 - n**2)
    da_r, da_z = da_n * h_n * r * (1.0 - r), dz * z * (1.0 - z)
    return (np.concatenate([da_r, da_z, da_n], axis=-1), np.concatenate([da_r, da_z, da_n * r], axis=-1),
            dh_new * z)


class GRU(_Recurrent):
    """Gated recurrent unit, stacked num_layers deep (torch.nn.GRU: parameters weight_ih_lk (3H, I_k),
    weight_hh_lk (3H, H), bias_ih_lk, bias_hh_lk (3H,), rows in gate order r, z, n)."""

    gates = 3

    def _forward_layer(self, k: int, x: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, tuple]:
        w_ih, w_hh, b_ih, b_hh = self.weights(k)
        a_in = x @ w_ih.data.T + (0 if b_ih is None else b_ih.data)     # the input side, every step at once
        hs = np.empty(a_in.shape[:2] + (self.hidden_size,), dtype=np.result_type(a_in, h))
        caches = []
        for t in range(x.shape[0]):
            a_h = h @ w_hh.data.T + (0 if b_hh is None else b_hh.data)
            h, cache = gru_cell_forward(a_in[t], a_h, h)
            hs[t] = h
            caches.append(cache)
        self._caches[k] = caches
        return hs, (h,)

    def _backward_layer(self, k: int, dy: np.ndarray, dh_next: np.ndarray) -> tuple[np.ndarray, tuple]:
        hs, w_hh, caches = self._outputs[k], self.weights(k)[1].data, self._caches[k]
        d_i = np.empty(dy.shape[:2] + (3 * self.hidden_size,), dtype=hs.dtype)
        d_h = np.empty_like(d_i)
        for t in reversed(range(dy.shape[0])):
            d_i[t], d_h[t], direct = gru_cell_backward(dy[t] + dh_next, caches[t])
            dh_next = direct + d_h[t] @ w_hh
        return self._add_gradients(k, d_i, d_h, self._previous_states(k)), (dh_next,)
