"""A transformer block with its sequence split over the c ranks of ``comm`` (context parallelism).

Every rank holds all the block's parameters and the tokens ``layout.positions(T, c, rank, layout)``.
Everything but attention works token by token, so it runs on those tokens unchanged; attention's
q·kᵀ needs every key, so its core is RingAttention (ring.py) — the projections stay local:

    x_r → ln1 → qkv (local) → RingAttention → proj (local) → + x_r → ln2 → mlp (local) → + h_r

A parameter's gradient is then a sum over this rank's tokens only; backward ends with one all-reduce of
all of them (as data parallelism does over samples): 2(c−1)/c·Ψ words per rank, Ψ the block's parameter
count, on top of the ring's K/V traffic (ring.py). Dropout is not supported (p must be 0).
"""

from __future__ import annotations

import copy

import numpy as np

from minidist.nn import CausalSelfAttention, Module, TransformerBlock
from minidist.nn.attention import merge_heads, split_heads
from minidist.nn.module import check_float_array
from minidist.parallel.tensor.sequence import add_other_tokens

from .ring import RingAttention


class ContextParallelAttention(Module):
    """``attn`` (nn.CausalSelfAttention) on this rank's tokens (B, T_r, d); sub-layers ``qkv``, ``proj``
    (whole copies) and ``ring`` (RingAttention over ``comm`` for a sequence of ``seq_len`` tokens)."""

    def __init__(self, comm, attn: CausalSelfAttention, seq_len: int, *, layout: str = "zigzag",
                 overlap: bool = True):
        if attn.attn_drop.p or attn.resid_drop.p:
            raise ValueError(f"ContextParallelAttention supports dropout = 0 only, got {attn.attn_drop.p}")
        self.n_heads = attn.n_heads
        self.qkv, self.proj = copy.deepcopy(attn.qkv), copy.deepcopy(attn.proj)
        self.ring = RingAttention(comm, seq_len, causal=attn.causal, layout=layout, overlap=overlap)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: this rank's tokens (B, T_r, d). Returns y (B, T_r, d)."""
        check_float_array(x, "ContextParallelAttention input", ndim=3)
        q, k, v = (split_heads(a, self.n_heads) for a in np.split(self.qkv.forward(x), 3, axis=-1))
        return self.proj.forward(merge_heads(self.ring.forward(q, k, v)))

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: (B, T_r, d). Adds this rank's tokens' terms into qkv's and proj's gradients; returns dx."""
        dq, dk, dv = self.ring.backward(split_heads(self.proj.backward(dy), self.n_heads))
        return self.qkv.backward(np.concatenate([merge_heads(a) for a in (dq, dk, dv)], axis=-1))


class ContextParallelBlock(Module):
    """``block`` (nn.TransformerBlock, dropout 0, the same on every rank) on this rank's tokens.

    seq_len: T of the whole sequence; layout: "naive" or "zigzag" (layout.py). Sub-layers ``ln1``,
    ``attn`` (ContextParallelAttention), ``ln2``, ``mlp`` in the block's order.
    """

    def __init__(self, comm, block: TransformerBlock, seq_len: int, *, layout: str = "zigzag",
                 overlap: bool = True):
        if block.mlp_drop.p:
            raise ValueError(f"ContextParallelBlock supports dropout = 0 only, got {block.mlp_drop.p}")
        self.comm = comm
        self.ln1 = copy.deepcopy(block.ln1)
        self.attn = ContextParallelAttention(comm, block.attn, seq_len, layout=layout, overlap=overlap)
        self.ln2, self.mlp = copy.deepcopy(block.ln2), copy.deepcopy(block.mlp)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: this rank's tokens (B, T_r, d) (layout.shard(x, c, rank, layout, axis=1)).
        Returns (B, T_r, d)."""
        h = x + self.attn.forward(self.ln1.forward(x))
        return h + self.mlp.forward(self.ln2.forward(h))

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: (B, T_r, d). Adds every parameter's gradient over ALL tokens (one all-reduce); returns dx."""
        params = self.parameters()
        before = [p.grad.copy() for p in params]
        dh = dy + self.ln2.backward(self.mlp.backward(dy))
        dx = dh + self.ln1.backward(self.attn.backward(dh))
        add_other_tokens(self.comm, params, before)            # add the other ranks' tokens' terms
        return dx
