"""Causal multi-head self-attention, forward and backward written out ("Attention Is All You Need"; GPT).

x (B, T, d) with h heads of d_k = d / h channels each:
    q, k, v  = split(x·W_qkvᵀ + b_qkv)          (B, T, d) each; qkv's 3d outputs are q | k | v, and head j
                                                 of each is its columns j·d_k … (j+1)·d_k − 1
             -> (B, h, T, d_k)                   one (T, d_k) matrix per sample and head
    S        = q·kᵀ / √d_k                       (B, h, T, T) scaled scores
    S[i, j]  = −∞ for j > i                      causal mask: position i attends to positions ≤ i only
    P        = softmax(S) along j                (B, h, T, T) each row sums to 1
    O        = dropout(P)·v                      (B, h, T, d_k) -> (B, T, d), heads side by side
    y        = dropout(O·W_projᵀ + b_proj)       (B, T, d)
Backward, the same products transposed (P̃ = dropout(P)):
    dP̃ = dO·vᵀ,   dv = P̃ᵀ·dO,   dP = dropout.backward(dP̃)
    dS = P ⊙ (dP − Σ_j dP ⊙ P) / √d_k          (softmax backward; masked entries have P = 0 so dS = 0)
    dq = dS·k,    dk = dSᵀ·q                     then concatenated back to (B, T, 3d) for qkv.backward
Cost (forward): 2·B·T·d·3d (qkv) + 2·2·B·T²·d (scores and P·v) + 2·B·T·d² (proj) = 8·B·T·d² + 4·B·T²·d
FLOPs; backward twice that. Memory kept for backward: q, k, v (3·B·T·d) and P (B·h·T², quadratic in T).
"""

from __future__ import annotations

import math

import numpy as np

from minidist.nn.checks import check_count

from .activation import Dropout
from .linear import Linear
from .module import Module, check_float_array, resolve_rng
from .softmax import softmax, softmax_backward


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """(B, T, d) -> (B, h, T, d_k): head j is channels j·d_k … (j+1)·d_k − 1."""
    b, t, d = x.shape
    return x.reshape(b, t, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, h, T, d_k) -> (B, T, h·d_k), heads side by side (the inverse of split_heads)."""
    b, h, t, dk = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * dk)


def causal_mask(t: int) -> np.ndarray:
    """(T, T) boolean, True where j > i: the future positions that row i must not see."""
    return np.triu(np.ones((t, t), dtype=bool), k=1)


class CausalSelfAttention(Module):
    """Multi-head self-attention with a causal mask (``causal=False``: every position sees every other).

    Sub-layers, in parameters() order: ``qkv`` (Linear d -> 3d), ``proj`` (Linear d -> d); ``attn_drop``
    on the probabilities and ``resid_drop`` on the output are Dropout(dropout) drawing from ``rng``.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, *, causal: bool = True,
                 rng: np.random.Generator | None = None, dtype=np.float32):
        if check_count(d_model, "CausalSelfAttention d_model") % check_count(n_heads, "n_heads"):
            raise ValueError(f"CausalSelfAttention needs d_model divisible by n_heads (both >= 1), "
                             f"got d_model={d_model}, n_heads={n_heads}")
        rng = resolve_rng(rng)
        self.d_model, self.n_heads = int(d_model), int(n_heads)
        self.d_head = self.d_model // self.n_heads
        self.causal = bool(causal)
        self.qkv = Linear(self.d_model, 3 * self.d_model, rng=rng, dtype=dtype)
        self.proj = Linear(self.d_model, self.d_model, rng=rng, dtype=dtype)
        self.attn_drop = Dropout(dropout, rng=rng)
        self.resid_drop = Dropout(dropout, rng=rng)
        self._q = self._k = self._v = self._probs = self._dropped = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input, shape (B, T, d_model); returns y, shape (B, T, d_model).
        Per head, q, k, v are (B, h, T, d_k) and the probabilities P (B, h, T, T)."""
        check_float_array(x, "CausalSelfAttention input", ndim=3)
        if x.shape[-1] != self.d_model or x.shape[1] < 1:
            raise ValueError(f"CausalSelfAttention expects input of shape (B, T, {self.d_model}) with "
                             f"T >= 1, got {x.shape}")
        self.remember_output_shape(x.shape)
        q, k, v = np.split(self.qkv.forward(x), 3, axis=-1)               # (B, T, d) each
        q, k, v = (split_heads(a, self.n_heads) for a in (q, k, v))        # (B, h, T, d_k) each
        scores = q @ k.transpose(0, 1, 3, 2) * (1.0 / math.sqrt(self.d_head))  # (B, h, T, T)
        if self.causal:
            # scores[..., mask] = −∞ as a broadcast copy (boolean indexing gathers indices: 10× slower)
            np.copyto(scores, -np.inf, where=causal_mask(x.shape[1]))
        self._probs = softmax(scores, axis=-1)
        self._q, self._k, self._v = q, k, v
        self._dropped = self.attn_drop.forward(self._probs)  # P̃ (P itself when dropout is off)
        out = self._dropped @ v                                            # (B, h, T, d_k)
        return self.resid_drop.forward(self.proj.forward(merge_heads(out)))

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape (B, T, d_model); returns dx, shape (B, T, d_model); adds the
        gradients of qkv and proj into their .grad."""
        self.check_upstream(dy)
        d_out = split_heads(self.proj.backward(self.resid_drop.backward(dy)), self.n_heads)  # (B, h, T, d_k)
        dv = self._dropped.transpose(0, 1, 3, 2) @ d_out                   # P̃ᵀ·dO
        d_probs = self.attn_drop.backward(d_out @ self._v.transpose(0, 1, 3, 2))  # dO·vᵀ, (B, h, T, T)
        d_scores = softmax_backward(self._probs, d_probs, axis=-1) * (1.0 / math.sqrt(self.d_head))
        dq = d_scores @ self._k                                            # (B, h, T, d_k)
        dk = d_scores.transpose(0, 1, 3, 2) @ self._q
        d_qkv = np.concatenate([merge_heads(a) for a in (dq, dk, dv)], axis=-1)  # (B, T, 3d): q | k | v
        return self.qkv.backward(d_qkv)

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """Forward matmul FLOPs for an input (B, T, d): 8·B·T·d² + 4·B·T²·d (backward costs twice)."""
        b, t, d = input_shape
        return 8 * b * t * d * d + 4 * b * t * t * d

    def __repr__(self) -> str:
        return f"CausalSelfAttention(d_model={self.d_model}, n_heads={self.n_heads}, causal={self.causal})"
