"""Tensor-parallel self-attention: the heads split over the t ranks of ``comm`` (Megatron-LM).

Shoeybi et al., "Megatron-LM" (2019), section 3: heads are independent, so rank p keeps heads H_p (the
np.array_split rule: t need not divide h, every rank needs one head) and runs them end to end.

    qkv   column-parallel: rank p holds the rows of q, k and v that belong to its heads, W_qkv (3·d_p, d)
    core  softmax(q·kᵀ/√d_k + mask)·v on its heads only, no communication   (d_p = |H_p|·d_k)
    proj  row-parallel: the columns of its heads, W_proj (d, d_p); the bias whole, added after the sum

    forward   x → f → qkv → attention → proj → g → + b        one all-reduce of B·T·d words (g)
    backward  the same in reverse                              one all-reduce of B·T·d words (f)

Each all-reduce sends 2(t−1)/t·B·T·d·itemsize bytes per rank. With sequence parallelism (sequence.py)
f and g become an all-gather and a reduce-scatter along T: the same bytes.
The core keeps (q, k, v, O, lse) and recomputes the probabilities in backward, as FlashAttention does
(minidist.parallel.context.blocks). Dropout is not supported (p must be 0).

Combined with context parallelism (t × c ranks): given ``context``, the communicator of the c ranks that
hold the other parts of the sequence for the same heads, the core is ring attention over it
(minidist.parallel.context.RingAttention) on this rank's heads and tokens; the rest is unchanged.
"""

from __future__ import annotations

import numpy as np

from minidist.nn import CausalSelfAttention, Linear, Module, Parameter
from minidist.nn.attention import merge_heads, split_heads
from minidist.nn.module import check_float_array
from minidist.parallel.context.blocks import block_attention, block_attention_backward
from minidist.parallel.context.ring import RingAttention

from .comm import check_same_on_all_ranks, feature_slice
from .sequence import region_operators


def local_linear(weight: np.ndarray, bias: np.ndarray | None) -> Linear:
    """A Linear holding copies of the given (out, in) weight and (out,) bias (a shard of a bigger one)."""
    layer = Linear(1, 1, bias=bias is not None, rng=np.random.default_rng(0), dtype=weight.dtype)
    layer.in_features, layer.out_features = weight.shape[1], weight.shape[0]
    layer.weight = Parameter(weight.copy())
    if bias is not None:
        layer.bias = Parameter(bias.copy())
    return layer


class TensorParallelAttention(Module):
    """``attn`` (an nn.CausalSelfAttention, the same on every rank) with its heads split over ``comm``.

    Sub-layers: ``qkv`` Linear(d, 3·d_p), ``proj`` Linear(d_p, d) without bias, ``bias`` (d,) whole.
    sequence_parallel: the input and output are this rank's tokens (B, T/t, d) (sequence.py).
    context: a communicator over which the sequence is also split (ring attention); then seq_len (the
    whole T) and layout ("naive" | "zigzag") say which tokens this rank's context group holds.
    """

    def __init__(self, comm, attn: CausalSelfAttention, *, sequence_parallel: bool = False, context=None,
                 seq_len: int | None = None, layout: str = "zigzag"):
        if attn.attn_drop.p or attn.resid_drop.p:
            raise ValueError(f"TensorParallelAttention supports dropout = 0 only, got {attn.attn_drop.p}")
        check_same_on_all_ranks(comm, "TensorParallelAttention (d_model, n_heads)",
                                (attn.d_model, attn.n_heads))
        if attn.n_heads < comm.world_size:
            raise ValueError(f"cannot split {attn.n_heads} heads over {comm.world_size} ranks: each rank "
                             f"needs at least one head")
        self.comm, self.causal, self.d_head = comm, attn.causal, attn.d_head
        self.sequence_parallel = bool(sequence_parallel)
        self.heads = feature_slice(attn.n_heads, comm.world_size, comm.rank)
        d, dk = attn.d_model, attn.d_head
        cols = np.arange(self.heads.start * dk, self.heads.stop * dk)        # this rank's channels of q, k, v
        rows = np.concatenate([cols, d + cols, 2 * d + cols])
        self.qkv = local_linear(attn.qkv.weight.data[rows], attn.qkv.bias.data[rows])
        self.proj = local_linear(attn.proj.weight.data[:, cols], None)
        self.bias = Parameter(attn.proj.bias.data.copy())
        self.enter, self.leave = region_operators(comm, self.sequence_parallel)
        self.ring = None
        if context is not None:
            if seq_len is None:
                raise ValueError("TensorParallelAttention with context= needs seq_len, "
                                 "the whole sequence's T")
            self.ring = RingAttention(context, seq_len, causal=self.causal, layout=layout)
        self._saved: tuple | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: (B, T, d) whole on every rank, or (B, T/t, d) this rank's tokens with sequence parallelism.
        Returns y of x's shape."""
        check_float_array(x, "TensorParallelAttention input", ndim=3)
        x_all = self.enter.forward(x)                                      # f (identity) or all-gather
        q, k, v = (split_heads(a, self.heads.stop - self.heads.start)
                   for a in np.split(self.qkv.forward(x_all), 3, axis=-1))  # (B, h_p, T, d_k) each
        if self.ring is not None:                                          # the sequence is split too
            out = self.ring.forward(q, k, v)
        else:
            mask = np.tri(x_all.shape[1], dtype=bool) if self.causal else None
            out, lse = block_attention(q, k, v, mask)
            self._saved = (q, k, v, mask, out, lse)
        y = self.leave.forward(self.proj.forward(merge_heads(out)))        # g (all-reduce) or reduce-scatter
        return y + self.bias.data

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: gradient of the output (x's shape). Adds into qkv's, proj's and bias's gradients;
        returns dx."""
        if self._saved is None and self.ring is None:
            raise RuntimeError("TensorParallelAttention.backward called before forward")
        self.bias.grad += dy.sum(axis=(0, 1))
        d_out = split_heads(self.proj.backward(self.leave.backward(dy)), self.heads.stop - self.heads.start)
        if self.ring is not None:
            dq, dk, dv = self.ring.backward(d_out)
        else:
            q, k, v, mask, out, lse = self._saved
            dq, dk, dv = block_attention_backward(q, k, v, mask, lse, d_out, (d_out * out).sum(axis=-1))
        dx_partial = self.qkv.backward(np.concatenate([merge_heads(a) for a in (dq, dk, dv)], axis=-1))
        return self.enter.backward(dx_partial)                             # all-reduce or reduce-scatter

    def __repr__(self) -> str:
        return (f"TensorParallelAttention(heads={self.heads.start}:{self.heads.stop}, "
                f"sequence_parallel={self.sequence_parallel})")
