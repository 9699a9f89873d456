"""Self-attention on this rank's tokens of a sequence split over the c ranks of a context group.

Every rank holds all of attention's weights and the tokens ``layout.positions(T, c, rank, layout)``. The
projections work token by token, so they run on those tokens unchanged; q·kᵀ needs every key, so the
attention ``core`` is RingAttention (ring.py), which passes the key/value blocks round the group:

    x_r (B, T_r, d) → qkv → split heads → RingAttention → merge heads → proj → y_r (B, T_r, d)

Dropout is not supported (p must be 0).
"""

from __future__ import annotations

import numpy as np

from minidist.nn import CausalSelfAttention, Module
from minidist.nn.attention import merge_heads, split_heads
from minidist.nn.module import check_float_array

from .ring import RingAttention


class ContextParallelAttention(Module):
    """``attn`` (nn.CausalSelfAttention) on this rank's tokens (B, T_r, d). Sub-layers ``qkv`` and ``proj``
    (attn's own Linear modules: no copy) and ``core`` (RingAttention over ``comm`` for a sequence of
    ``seq_len`` tokens; None: c·T_r)."""

    def __init__(self, comm, attn: CausalSelfAttention, seq_len: int | None = None, *, layout: str = "zigzag",
                 overlap: bool = True):
        if attn.attn_drop.p or attn.resid_drop.p:
            raise ValueError(f"ContextParallelAttention supports dropout = 0 only, got {attn.attn_drop.p}")
        self.d_model, self.n_heads, self.d_head = attn.d_model, attn.n_heads, attn.d_head
        self.causal = attn.causal
        self.qkv = attn.qkv
        self.core = RingAttention(comm, seq_len, causal=attn.causal, layout=layout, overlap=overlap)
        self.proj = attn.proj

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: this rank's tokens (B, T_r, d). Returns y (B, T_r, d)."""
        check_float_array(x, "ContextParallelAttention input", ndim=3)
        q, k, v = (split_heads(a, self.n_heads) for a in np.split(self.qkv.forward(x), 3, axis=-1))
        return self.proj.forward(merge_heads(self.core.forward(q, k, v)))

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: (B, T_r, d). Adds this rank's tokens' terms into qkv's and proj's gradients; returns dx."""
        dq, dk, dv = self.core.backward(split_heads(self.proj.backward(dy), self.n_heads))
        return self.qkv.backward(np.concatenate([merge_heads(a) for a in (dq, dk, dv)], axis=-1))

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """Forward FLOPs of the projections on this rank's (B, T_r, d) (the ring charges its own blocks)."""
        b, t, d = input_shape
        return 8 * b * t * d * d
