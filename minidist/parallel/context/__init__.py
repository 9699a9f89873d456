"""Context parallelism: the sequence split over c ranks inside attention (ring attention).

blocks.py (one key/value block's partial attention, the online-softmax merge, the block's backward),
layout.py (which tokens a rank holds: naive or zigzag split), ring.py (RingAttention on a
communicator), block.py (a transformer block on a slice of the sequence), gpt.py (a whole GPT), cost.py
(bytes, messages and time in closed form)."""

from .block import ContextParallelAttention, ContextParallelBlock
from .blocks import block_attention, block_attention_backward, block_flops, causal_mask, merge
from .cost import causal_work, crossover_seq_len, ring_traffic, step_seconds
from .gpt import ContextParallelGPT
from .layout import LAYOUTS, causal_pairs, positions, shard, unshard
from .ring import RingAttention

__all__ = [
    "LAYOUTS",
    "ContextParallelAttention",
    "ContextParallelBlock",
    "ContextParallelGPT",
    "RingAttention",
    "block_attention",
    "block_attention_backward",
    "block_flops",
    "causal_mask",
    "causal_pairs",
    "causal_work",
    "crossover_seq_len",
    "merge",
    "positions",
    "ring_traffic",
    "shard",
    "step_seconds",
    "unshard",
]
