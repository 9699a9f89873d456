"""``context_parallel``: split the sequence of a GPT (or of one transformer block) over the c ranks of a
group, in place — ring attention (Liu et al., "Ring Attention with Blockwise Transformers").

Everything but attention works token by token, so it runs on this rank's tokens unchanged; q·kᵀ needs
every key, so the transform swaps attention's core for RingAttention (ring.py), which passes the key/value
blocks round the group, and tells the GPT which positions its tokens have:

    blocks.attn        nn.CausalSelfAttention -> ContextParallelAttention (same qkv, proj; core = ring):
                       x_r (B, T_r, d) → qkv → split heads → RingAttention → merge heads → proj → y_r;
                       a TensorParallelAttention keeps its split linears and gets core = RingAttention
    position_ids       ContextPositions: this rank's layout positions (naive or zigzag, layout.py)

Rank r is given its tokens ``shard(tokens, c, r, layout, axis=1)`` (B, T_r) and its loss must be its share
of the mean over all B·T tokens (its own mean × T_r/T). Every parameter's gradient is then a sum over this
rank's tokens only: the transform appends the group to every ``partial_over`` (the gradient sync adds one
all-reduce, 2(c−1)/c·Ψ words per rank, on top of the ring's K/V traffic). Dropout is not supported.
"""

from __future__ import annotations

import numpy as np

from minidist.nn import GPT, CausalSelfAttention, Module, TransformerBlock
from minidist.nn.attention import merge_heads, split_heads
from minidist.nn.checks import check_count
from minidist.nn.module import check_float_array

from .layout import positions
from .ring import RingAttention


class ContextParallelAttention(Module):
    """``attn`` (nn.CausalSelfAttention) on this rank's tokens (B, T_r, d). Sub-layers ``qkv`` and ``proj``
    (attn's own Linear modules: no copy) and ``core`` (RingAttention over ``comm`` for a sequence of
    ``seq_len`` tokens; None: c·T_r)."""

    def __init__(self, comm, attn: CausalSelfAttention, seq_len: int | None, layout: str):
        if attn.attn_drop.p or attn.resid_drop.p:
            raise ValueError(f"ContextParallelAttention supports dropout = 0 only, got {attn.attn_drop.p}")
        self.d_model, self.n_heads, self.d_head = attn.d_model, attn.n_heads, attn.d_head
        self.causal = attn.causal
        self.qkv = attn.qkv
        self.core = RingAttention(comm, seq_len, causal=attn.causal, layout=layout)
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


class ContextPositions:
    """A split GPT's ``position_ids``: the global positions of the t tokens this rank holds
    (``layout.positions(T, c, rank, layout)``, T = seq_len, or c·t when None)."""

    def __init__(self, comm, layout: str = "zigzag", seq_len: int | None = None):
        self.comm, self.layout, self.seq_len = comm, layout, seq_len

    def __call__(self, t: int) -> np.ndarray:
        c = self.comm.world_size
        where = positions(self.seq_len or c * t, c, self.comm.rank, self.layout)
        if len(where) != t:
            raise ValueError(f"context rank {self.comm.rank} holds {len(where)} tokens of the {self.layout} "
                             f"split (shard the tokens with layout.shard), got {t}")
        return where


def context_parallel(model: Module, group, *, layout: str = "zigzag", seq_len: int | None = None) -> Module:
    """Split ``model`` (an nn.GPT / SwitchTransformer or an nn.TransformerBlock, dropout 0, the same on every
    rank; possibly tensor-parallel already) over ``group`` along the sequence, in place; returns it.
    Input: this rank's tokens (B, T_r) (a block: x (B, T_r, d)); output: their logits (B, T_r, V).
    seq_len: T of the whole sequence (None: c·T_r, every rank the same number of tokens)."""
    if seq_len is not None:
        check_count(seq_len, "context_parallel seq_len")          # 7.5 or True are not lengths
    if isinstance(model, GPT):
        if model.drop.p:
            raise ValueError(f"context_parallel supports dropout = 0 only, got {model.drop.p}")
        if seq_len is not None and not 1 <= seq_len <= model.block_size:
            raise ValueError(f"seq_len must lie in [1, block_size = {model.block_size}], got {seq_len}")
        blocks = model.blocks
        here = ContextPositions(group, layout, seq_len)
        inner = getattr(model.position_ids, "inner", None)
        if inner is not None:   # sequence parallelism cuts this rank's positions further: keep it outside
            model.position_ids.inner = here
        else:
            model.position_ids = here
    elif isinstance(model, TransformerBlock):
        blocks = [model]
    else:
        raise TypeError(f"context_parallel splits an nn.GPT or an nn.TransformerBlock, "
                        f"got {type(model).__name__}")
    for block in blocks:
        if block.mlp_drop.p:
            raise ValueError(f"context_parallel supports dropout = 0 only, got {block.mlp_drop.p}")
        if isinstance(block.attn, CausalSelfAttention):
            block.attn = ContextParallelAttention(group, block.attn, seq_len, layout)
        else:                        # an attention split otherwise (tensor parallel): swap its core only
            block.attn.core = RingAttention(group, seq_len, causal=block.attn.causal, layout=layout)
    model.label_parameters()           # names for the optimizers' refusal of a partial gradient
    for p in model.parameters():
        p.partial_over.append(group)   # each rank's gradient covers its own tokens only
    return model
