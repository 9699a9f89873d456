"""The expert axis of the grid (grid_pipeline.py): a Switch Transformer's units for
``DataPipelineGrid(..., expert=e)``, its blocks split over the tensor, context and expert groups at once.

    attention   TensorParallelAttention: heads split over the tensor group, ring attention over the
                context group (tensor_parallel, context_parallel: as tensor_gpt_units' blocks)
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

from minidist.nn import GPT, Sequential
from minidist.nn.gpt import GPTInput

from .context import ContextPositions, context_parallel
from .expert import ExpertParallelMoE
from .grid_pipeline import Priced
from .tensor import tensor_parallel


def switch_units(tensor_comm, context_comm, expert_comm, gpt: GPT, seq_len: int | None = None) -> Sequential:
    """A SwitchTransformer ``gpt`` (dropout 0, untied) as the grid's units: GPTInput, copies of its blocks
    split by the transforms (context_parallel, tensor_parallel: Megatron experts, then the MoE
    expert-parallel over expert_comm), ln_f, head. context_comm: None, or the context group (then seq_len,
    and this rank's zigzag positions).
    Use it as ``DataPipelineGrid(comm, lambda t, c, e: switch_units(t, c, e, gpt, T), ..., expert=e)``."""
    if gpt.drop.p or gpt.tie_weights:
        raise ValueError("a pipelined Switch model needs dropout 0 and untied weights")
    t = tensor_comm.world_size
    where = gpt.position_ids if context_comm is None else ContextPositions(context_comm, "zigzag", seq_len)
    blocks = []
    for b in gpt.blocks:
        split = copy.deepcopy(b)
        if context_comm is not None:
            context_parallel(split, context_comm, seq_len=seq_len)
        tensor_parallel(split, tensor_comm)
        split.mlp = ExpertParallelMoE(expert_comm, split.mlp)
        # the clock: attention's share here; the experts charge their own rows (ExpertParallelMoE)
        blocks.append(Priced(split, lambda shape, b=b: b.attn.flops(shape) // t))
    return Sequential(GPTInput(gpt.tok_emb, gpt.pos_emb, gpt.drop, where), *blocks, gpt.ln_f, gpt.head)
