"""``tensor_parallel``: split a GPT (or one transformer block) over the t ranks of a group, in place —
Megatron's layout, optionally with sequence parallelism (Korthikanti et al.).

The transform only swaps sub-modules (picotron's apply_tensor_parallel, PyTorch's parallelize_module);
forward and backward stay nn.GPT's and nn.TransformerBlock's:

    tok_emb      -> VocabParallelEmbedding   rows V_p of the table; g (all-reduce), SP: reduce-scatter along T
    blocks.attn  -> TensorParallelAttention  heads H_p: column-parallel qkv, row-parallel proj
    blocks.mlp   -> MegatronMLP              hidden units F_p (an MoE: each expert a MegatronMLP)
    head         -> VocabParallelHead        logits of ids V_p, never gathered: the loss is
                                             VocabParallelCrossEntropy(group, V)

Bytes per block: transformer_cost.block_bytes_sent. With sequence parallelism the LayerNorms, residuals and
position embedding see T/t tokens per rank, so their gradients — and those of the two biases added after
a reduce-scatter — are partial sums over the group: the transform appends the group to their
``partial_over`` (the gradient sync adds 2(t−1)/t·(6d per block + T_max·d + 2d) words).
"""

from __future__ import annotations

import copy

from minidist.nn import GPT, Module, TransformerBlock

from .attention import TensorParallelAttention
from .mlp import MegatronMLP
from .sequence import SequenceShard
from .vocab_parallel import VocabParallelEmbedding, VocabParallelHead


def tensor_parallel(model: Module, group, *, sequence_parallel: bool = False) -> Module:
    """Split ``model`` (an nn.GPT or SwitchTransformer, or an nn.TransformerBlock; dropout 0; the same on
    every rank) over ``group`` in place; returns it. Input: tokens (B, T) the same on every rank (a block:
    x (B, T, d), or this rank's (B, T/t, d) with sequence parallelism); output: this rank's logits
    (B, T, |V_p|) (a block: x's shape)."""
    if not isinstance(model, (GPT, TransformerBlock)):
        raise TypeError(f"tensor_parallel splits an nn.GPT or an nn.TransformerBlock, "
                        f"got {type(model).__name__}")
    if isinstance(model, GPT) and model.drop.p:
        raise ValueError(f"tensor_parallel supports dropout = 0 only, got {model.drop.p}")
    model.label_parameters()                   # the shards keep the names (error messages)
    if isinstance(model, TransformerBlock):
        _split_block(model, group, sequence_parallel)
        return model
    model.tok_emb = VocabParallelEmbedding(group, model.tok_emb, sequence_parallel=sequence_parallel)
    for block in model.blocks:
        _split_block(block, group, sequence_parallel)
    tied = model.tok_emb.weight if model.tie_weights else None   # the same rows V_p: one Parameter
    model.head = VocabParallelHead(group, model.head, sequence_parallel=sequence_parallel, tied=tied)
    if sequence_parallel:
        model.position_ids = SequenceShard(group, model.position_ids)
        _mark_partial([model.pos_emb.weight, model.ln_f.weight, model.ln_f.bias], group)
    return model


def _split_block(block: TransformerBlock, group, sequence_parallel: bool) -> None:
    if block.mlp_drop.p:
        raise ValueError(f"tensor_parallel supports dropout = 0 only, got {block.mlp_drop.p}")
    moe = hasattr(block.mlp, "experts")   # an nn.MoE, or an expert-parallel one (its experts are this rank's)
    if moe and sequence_parallel:
        raise ValueError("sequence parallelism with a mixture-of-experts mlp is not supported")
    block.attn = TensorParallelAttention(group, block.attn, sequence_parallel=sequence_parallel)
    if moe:
        block.mlp = _split_experts(group, block.mlp)
    else:
        block.mlp = MegatronMLP.from_mlp(group, block.mlp, sequence_parallel=sequence_parallel)
    if sequence_parallel:   # applied to this rank's T/t tokens only
        _mark_partial([block.ln1.weight, block.ln1.bias, block.attn.bias, block.ln2.weight, block.ln2.bias,
                       block.mlp.down.bias], group)


def _split_experts(group, moe: Module) -> Module:
    """The MoE (router whole) with every expert Megatron-split: rows of its first Linear, columns of its
    second (the Switch slide's expert+model layout). A shallow copy: an expert-parallel MoE keeps its own."""
    if group.world_size == 1:
        return moe
    split = copy.copy(moe)
    split.experts = [MegatronMLP.from_mlp(group, ex) for ex in moe.experts]
    return split


def _mark_partial(params, group) -> None:
    for p in params:
        p.partial_over.append(group)
