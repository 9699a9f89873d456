"""The distributed persistent RNN: an Elman RNN's hidden units split over the ranks, one exchange per step.

Catanzaro's "Scaling Deep Learning" slides (Distributed persistent RNNs, after Diamos et al. ICML 2016):
"to overcome capacity limitations, distribute the model! This requires a global barrier between
processors" — each processor keeps its slice of the recurrent weights on chip for the whole sequence.

Rank p of P owns hidden units U_p (split_range(H, P, p)): the rows U_p of W_ih, W_hh, b_ih, b_hh. Step t:

    forward   h_t[:, U_p] = tanh(x_t·W_ih[U_p]ᵀ + b[U_p] + h_(t−1)·W_hh[U_p]ᵀ)     local, needs all of h_(t−1)
              h_t = allgather_p(h_t[:, U_p])                                          the per-step exchange
    backward  da_t[:, U_p] = (dy_t[:, U_p] + dh_t[:, U_p]) ⊙ (1 − h_t[:, U_p]²)
              dh_(t−1)[:, U_q] = Σ_p da_t[:, U_p]·W_hh[U_p, U_q]                      an all-to-all, summed
              dW_hh[U_p] = Σ_t da_t[:, U_p]ᵀ·h_(t−1),  dW_ih[U_p] = Σ_t da_t[:, U_p]ᵀ·x_t   local
              dx = allreduce_p(Σ_p da[:, :, U_p]·W_ih[U_p])                          once, after the loop

Per step each rank sends (P−1)/P·N·H values forward and the same backward; the weights never move and
their gradients need no allreduce (each rank updates its own rows). Memory per rank: (H/P)·(I + H) weights.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import allgather, allreduce, alltoall
from minidist.collectives.pieces import split_range
from minidist.nn import RNN, Module, Parameter
from minidist.nn.module import check_float_array


class PersistentRNN(Module):
    """nn.RNN(input_size, H) (tanh, with bias, time-major) with its hidden units split over ``comm``.

    Built from a full RNN that every rank created alike (same seed); this rank keeps rows U_p of
    ``weight_ih_l0`` (|U_p|, I), ``weight_hh_l0`` (|U_p|, H), ``bias_ih_l0``, ``bias_hh_l0`` (|U_p|,).
    forward(x (T, N, I), the same on every rank) → (output (T, N, H), h_n (1, N, H)), whole on every rank,
    as nn.RNN returns them. backward(dy (T, N, H), dh_n (1, N, H) or None, the same on every rank) →
    dx (T, N, I), whole on every rank.
    """

    def __init__(self, comm, full: RNN):
        if not isinstance(full, RNN) or full.nonlinearity != "tanh" or full.bias_ih_l0 is None \
                or full.batch_first or full.num_layers != 1:
            raise TypeError("PersistentRNN splits an nn.RNN with tanh, bias=True, batch_first=False and "
                            "num_layers=1")
        self.comm, self.hidden_size, self.input_size = comm, full.hidden_size, full.input_size
        self.ranges = [split_range(full.hidden_size, comm.world_size, p) for p in range(comm.world_size)]
        self.units = slice(*self.ranges[comm.rank])
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            setattr(self, name, Parameter(getattr(full, name).data[self.units].copy()))

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        check_float_array(x, "PersistentRNN input", ndim=3)
        if x.shape[-1] != self.input_size:
            raise ValueError(f"PersistentRNN expects input (T, N, {self.input_size}), got {x.shape}")
        a_in = x @ self.weight_ih_l0.data.T + self.bias_ih_l0.data + self.bias_hh_l0.data   # (T, N, |U_p|)
        h = np.zeros((x.shape[1], self.hidden_size), dtype=a_in.dtype)
        hs = np.empty((x.shape[0], x.shape[1], self.hidden_size), dtype=a_in.dtype)
        for t in range(x.shape[0]):
            mine = np.tanh(a_in[t] + h @ self.weight_hh_l0.data.T)
            h = np.concatenate(allgather(self.comm, mine), axis=1)     # the global barrier of the slides
            hs[t] = h
        self._x, self._hs = x, hs
        self.remember_output_shape(hs.shape)
        return hs.copy(), hs[-1:].copy()

    def backward(self, dy: np.ndarray, dh_n: np.ndarray | None = None) -> np.ndarray:
        self.check_upstream(dy)
        hs, u = self._hs, self.units
        if dh_n is not None and np.shape(dh_n) != (1, *hs.shape[1:]):
            raise ValueError(f"PersistentRNN expects dh_n of shape {(1, *hs.shape[1:])}, "
                             f"got {np.shape(dh_n)}")
        da = np.empty(hs.shape[:2] + (u.stop - u.start,), dtype=hs.dtype)
        # dh_t[:, U_p] from step t + 1; at the last step, the final state's gradient
        dh_mine = np.zeros_like(da[0]) if dh_n is None else np.array(dh_n[0, :, u], dtype=hs.dtype)
        for t in reversed(range(hs.shape[0])):
            da[t] = (dy[t, :, u] + dh_mine) * (1.0 - hs[t, :, u] ** 2)
            partial = da[t] @ self.weight_hh_l0.data                    # this rank's share of dh_(t−1) (N, H)
            received = alltoall(self.comm, [partial[:, lo:hi] for lo, hi in self.ranges])
            dh_mine = sum(received[1:], start=received[0])             # Σ_p in rank order
        h_prev = np.concatenate([np.zeros_like(hs[:1]), hs[:-1]])
        self.weight_ih_l0.grad += np.einsum("tng,tni->gi", da, self._x)
        self.weight_hh_l0.grad += np.einsum("tng,tnh->gh", da, h_prev)
        self.bias_ih_l0.grad += da.sum(axis=(0, 1))
        self.bias_hh_l0.grad += da.sum(axis=(0, 1))
        return allreduce(self.comm, da @ self.weight_ih_l0.data)
