"""The expert axis of the grid (grid_pipeline.py): a Switch Transformer's units for
``DataPipelineGrid(..., expert=e)``, its blocks split over the tensor, context and expert groups at once.

    attention   TensorParallelAttention: heads split over the tensor group, ring attention over the
                context group (as tensor_gpt_units' blocks)
    MoE layer   ExpertParallelMoE over the expert group: E/e experts per rank, tokens to their expert
                and back by all-to-all; each expert also Megatron-split over the tensor group (rows of its
                first Linear, columns of its second), the Switch slide's expert+model+data layout
    the rest    embeddings, norms, routers, head: whole on every rank (replicated)

Gradients of the global mean loss, with S = D·e token sets (one per (data replica, expert rank)):
    an expert      holds Σ over its expert group's tokens (the all-to-all brought them) → / e, then the
                   sum over its D copies (the data group) → / D
    replicated     summed over the expert group → / e (AverageGradients at the pipeline's end_backward),
                   then over the data group → / D
so both are Σ over the S token sets / S. Routing: every rank routes its micro-batch's tokens (with context,
its positions of them) as one group — capacity ceil(c·n/E) and the balance loss are per group, and
DataPipelineGrid scales each group's router losses by its share 1/(M·c) of the batch.

Cost per MoE layer, step and rank: the all-to-alls of expert/cost.py over the expert group (≈ 4·k·n·
(e−1)/e·d words at uniform routing, n this rank's tokens), the experts' Megatron all-reduces over the
tensor group, and 2(e−1)/e·|W_replicated| words on the expert ring, then 2(D−1)/D·|W_stage| on the data ring.
"""

from __future__ import annotations

import copy

from minidist.nn import GELU, GPT, MoE, Sequential, TransformerBlock

from .context.layout import positions
from .expert import ExpertParallelMoE
from .grid_pipeline import GPTInput, Priced
from .tensor import MegatronMLP
from .tensor.attention import TensorParallelAttention
from .tensor.block import TensorParallelBlock


def split_experts(tensor_comm, moe: MoE) -> MoE:
    """A shallow copy of moe whose experts are Megatron-split over tensor_comm (moe itself if t = 1)."""
    if tensor_comm.world_size == 1:
        return moe
    split = copy.copy(moe)
    split.experts = [MegatronMLP(tensor_comm, ex.layers[0], ex.layers[2], GELU()) for ex in moe.experts]
    return split


class TensorExpertBlock(TensorParallelBlock):
    """A Switch block (an nn.TransformerBlock whose ``mlp`` is an nn.MoE, dropout 0) split over
    tensor_comm × expert_comm (× context): TensorParallelBlock's forward and backward (x (B, T, d) whole
    on the tensor ranks -> (B, T, d); with context, the block's gradients summed over the context group),
    with the ExpertParallelMoE of split experts in place of the Megatron MLP."""

    def __init__(self, tensor_comm, expert_comm, block: TransformerBlock, *, context=None,
                 seq_len: int | None = None):
        if not isinstance(block.mlp, MoE):
            raise TypeError(f"TensorExpertBlock splits a block whose mlp is an MoE, got "
                            f"{type(block.mlp).__name__}")
        if block.mlp_drop.p:
            raise ValueError(f"TensorExpertBlock supports dropout = 0 only, got {block.mlp_drop.p}")
        self.comm, self.sequence_parallel, self.context = tensor_comm, False, context
        self.ln1 = copy.deepcopy(block.ln1)
        self.attn = TensorParallelAttention(tensor_comm, block.attn, context=context, seq_len=seq_len)
        self.ln2 = copy.deepcopy(block.ln2)
        self.mlp = ExpertParallelMoE(expert_comm, split_experts(tensor_comm, block.mlp))


def switch_units(tensor_comm, context_comm, expert_comm, gpt: GPT, seq_len: int | None = None) -> Sequential:
    """A SwitchTransformer ``gpt`` (dropout 0, untied) as the grid's units: GPTInput, TensorExpertBlocks,
    ln_f, head. context_comm: None, or the context group (then seq_len, and this rank's zigzag positions).
    Use it as ``DataPipelineGrid(comm, lambda t, c, e: switch_units(t, c, e, gpt, T), ..., expert=e)``."""
    if gpt.drop.p or gpt.tie_weights:
        raise ValueError("a pipelined Switch model needs dropout 0 and untied weights")
    t = tensor_comm.world_size
    where = None if context_comm is None else positions(seq_len, context_comm.world_size, context_comm.rank)
    blocks = []
    for b in gpt.blocks:
        split = TensorExpertBlock(tensor_comm, expert_comm, b, context=context_comm, seq_len=seq_len)
        helpers = [] if split.attn.ring is None else [split.attn.ring]
        # the clock: attention's share here; the experts charge their own rows (ExpertParallelMoE)
        blocks.append(Priced(split, lambda shape, b=b: b.attn.flops(shape) // t, helpers))
    return Sequential(GPTInput(gpt, where), *blocks, gpt.ln_f, gpt.head)
