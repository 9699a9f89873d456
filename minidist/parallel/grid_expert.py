"""The expert axis of the grid (grid_pipeline.py): a Switch Transformer's units for
``DataPipelineGrid(..., expert=e)``, its blocks split over the tensor, context and expert groups at once by
the three transforms, applied one after another to the same model:

    tensor_parallel    each block: heads over the tensor group; each expert Megatron-split over it (rows
                       of its first Linear, columns of its second), the Switch slide's expert+model layout
    context_parallel   ring attention over the context group, this rank's zigzag positions
    expert_parallel    each MoE layer: E/e experts per rank, tokens to their expert and back by all-to-all
    the rest           embeddings, norms, routers, head: whole on every rank (replicated)

Gradients of the global mean loss, with S = D·e token sets (one per (data replica, expert rank)) and each
rank's loss its share 1/(S·c): an expert holds Σ over its expert group's tokens (the all-to-all brought
them), then the sum over its D copies (the data group); a replicated parameter is summed over the expert
group (its ``partial_over``), then over the data group. Routing: every rank routes its micro-batch's tokens
(with context, its positions of them) as one group — capacity ceil(c·n/E) and the balance loss are per
group, and DataPipelineGrid scales each group's router losses by its share 1/(S·M·c) of the batch.

Cost per MoE layer, step and rank: the all-to-alls of expert/cost.py over the expert group (≈ 4·k·n·
(e−1)/e·d words at uniform routing, n this rank's tokens), the experts' Megatron all-reduces over the
tensor group, and 2(e−1)/e·|W_replicated| words over the expert group, then
2(D−1)/D·|W_stage| on the data ring.
"""

from __future__ import annotations

from minidist.nn import GPT, Sequential

from .context import context_parallel
from .expert import expert_parallel
from .tensor import tensor_parallel


def switch_units(tensor_comm, context_comm, expert_comm, gpt: GPT, seq_len: int | None = None) -> Sequential:
    """A SwitchTransformer ``gpt`` (dropout 0, untied) split in place over the three groups, as the grid's
    units: the embeddings, the blocks, ln_f, head. context_comm: None, or the context group (then seq_len,
    and this rank's zigzag positions). Each block prices itself: its split attention's share (1/t when t
    divides the heads) and 0 for the expert-parallel MoE (the experts charge their own rows). Use it as
    ``DataPipelineGrid(comm, lambda t, c, e: switch_units(t, c, e, gpt, T), ..., expert=e)``."""
    if gpt.drop.p or gpt.tie_weights:
        raise ValueError("a pipelined Switch model needs dropout 0 and untied weights")
    for b in gpt.blocks:
        tensor_parallel(b, tensor_comm)
    if context_comm is not None:
        context_parallel(gpt, context_comm, seq_len=seq_len)
    expert_parallel(gpt, expert_comm)
    return Sequential(*gpt.units())
