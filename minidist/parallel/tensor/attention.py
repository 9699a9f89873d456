"""Tensor-parallel self-attention: the heads split over the t ranks of ``comm`` (Megatron-LM).

Shoeybi et al., "Megatron-LM" (2019), section 3: heads are independent, so rank p keeps heads H_p (the
np.array_split rule: t need not divide h, every rank needs one head) and runs them end to end.

    qkv   column-parallel: rank p holds the rows of q, k and v that belong to its heads, W_qkv (3·d_p, d)
    core  softmax(q·kᵀ/√d_k + mask)·v on its heads only, no communication   (d_p = |H_p|·d_k)
    proj  row-parallel: the columns of its heads, W_proj (d, d_p); the bias whole, added after the sum

    forward   x → f → qkv → attention → proj → g → + b        one all-reduce of B·T·d words (g)
    backward  the same in reverse                              one all-reduce of B·T·d words (f)

With sequence parallelism f and g are an all-gather and a reduce-scatter along T (sequence.py). The
``core`` keeps (q, k, v, O, lse) and recomputes the probabilities in backward, as FlashAttention does
(nn.BlockwiseAttention); context parallelism replaces it by ring attention. Dropout is not supported.
"""

from __future__ import annotations

import numpy as np

from minidist.nn import CausalSelfAttention, Linear, Module, Parameter
from minidist.nn.attention import merge_heads, split_heads
from minidist.nn.blockwise_attention import BlockwiseAttention
from minidist.nn.module import check_float_array

from .comm import check_same_on_all_ranks, feature_slice, shard_parameter
from .sequence import region_operators


def local_linear(weight: Parameter, bias: Parameter | None) -> Linear:
    """A Linear around the given (out, in) weight and (out,) bias Parameters (shards of a bigger layer's)."""
    layer = Linear(1, 1, bias=bias is not None, rng=np.random.default_rng(0), dtype=weight.data.dtype)
    layer.in_features, layer.out_features = weight.shape[1], weight.shape[0]
    layer.weight, layer.bias = weight, bias
    return layer


class TensorParallelAttention(Module):
    """``attn`` (an nn.CausalSelfAttention, the same on every rank) with its heads split over ``comm``.

    Sub-layers: ``qkv`` Linear(d, 3·d_p), ``core`` (nn.BlockwiseAttention on this rank's heads, or the
    core ``attn`` already has — a context-split attention's ring), ``proj`` Linear(d_p, d) without bias,
    ``bias`` (d,) whole. sequence_parallel: input and output are this rank's tokens (B, T/t, d).
    """

    def __init__(self, comm, attn, *, sequence_parallel: bool = False):
        drop = getattr(attn, "attn_drop", None), getattr(attn, "resid_drop", None)
        if any(d is not None and d.p for d in drop):
            raise ValueError(f"TensorParallelAttention supports dropout = 0 only, got {drop[0].p}")
        check_same_on_all_ranks(comm, "TensorParallelAttention (d_model, n_heads)",
                                (attn.d_model, attn.n_heads))
        if attn.n_heads < comm.world_size:
            raise ValueError(f"cannot split {attn.n_heads} heads over {comm.world_size} ranks: each rank "
                             f"needs at least one head")
        self.comm, self.causal, self.d_head = comm, attn.causal, attn.d_head
        self.d_model, self.n_heads = attn.d_model, attn.n_heads
        self.sequence_parallel = bool(sequence_parallel)
        self.heads = feature_slice(attn.n_heads, comm.world_size, comm.rank)
        d, dk = attn.d_model, attn.d_head
        cols = np.arange(self.heads.start * dk, self.heads.stop * dk)        # this rank's channels of q, k, v
        rows = np.concatenate([cols, d + cols, 2 * d + cols])
        self.qkv = local_linear(shard_parameter(attn.qkv.weight, rows), shard_parameter(attn.qkv.bias, rows))
        # nn's attention keeps the (T × T) probabilities; a split one keeps (O, lse) instead
        self.core = BlockwiseAttention(attn.causal) if isinstance(attn, CausalSelfAttention) else attn.core
        self.proj = local_linear(shard_parameter(attn.proj.weight, (slice(None), cols)), None)
        self.bias = shard_parameter(attn.proj.bias)
        self.enter, self.leave = region_operators(comm, self.sequence_parallel)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: (B, T, d), whole on every rank (sequence parallel: this rank's (B, T/t, d)). Returns y (x's)."""
        check_float_array(x, "TensorParallelAttention input", ndim=3)
        x_all = self.enter.forward(x)                                      # f (identity) or all-gather
        q, k, v = (split_heads(a, self.heads.stop - self.heads.start)
                   for a in np.split(self.qkv.forward(x_all), 3, axis=-1))  # (B, h_p, T, d_k) each
        out = self.core.forward(q, k, v)
        y = self.leave.forward(self.proj.forward(merge_heads(out)))        # g (all-reduce) or reduce-scatter
        return y + self.bias.data

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: the output's gradient (x's shape). Adds into qkv's, proj's and bias's gradients; returns dx."""
        self.bias.grad += dy.sum(axis=(0, 1))
        d_out = split_heads(self.proj.backward(self.leave.backward(dy)), self.heads.stop - self.heads.start)
        dq, dk, dv = self.core.backward(d_out)
        dx_partial = self.qkv.backward(np.concatenate([merge_heads(a) for a in (dq, dk, dv)], axis=-1))
        return self.enter.backward(dx_partial)                             # all-reduce or reduce-scatter

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """This rank's forward matmul FLOPs for x (B, T, d) (sequence parallel: (B, T/t, d), gathered to
        B·T·t tokens first): its heads' share of CausalSelfAttention's 8·B·T·d² + 4·B·T²·d,

            qkv 6·B·T·d·d_p  +  q·kᵀ and P·v 4·B·T²·d_p  +  proj 2·B·T·d_p·d  =  8·B·T·d·d_p + 4·B·T²·d_p

        with d_p = |H_p|·d_k (the t shares add up to the whole count). The T² term is that of the T tokens
        given here, whatever the core: a RingAttention core charges its key/value blocks itself besides."""
        b, seq, d = input_shape
        if d != self.d_model:
            raise ValueError(f"TensorParallelAttention.flops expects (B, T, {self.d_model}), "
                             f"got {tuple(input_shape)}")
        seq *= self.comm.world_size if self.sequence_parallel else 1
        d_p = (self.heads.stop - self.heads.start) * self.d_head
        return 8 * b * seq * d * d_p + 4 * b * seq * seq * d_p

    def __repr__(self) -> str:
        return (f"TensorParallelAttention(heads={self.heads.start}:{self.heads.stop}, "
                f"sequence_parallel={self.sequence_parallel}, core={self.core!r})")
