"""Context parallelism: the sequence split over c ranks inside attention (ring attention).

transform.py (``context_parallel``: split a GPT or a block in place, attention on this rank's tokens),
ring.py (RingAttention on a communicator and its step, the online-softmax merge; the key/value blocks
themselves are nn.blockwise_attention's), layout.py (which tokens a rank holds: naive or zigzag split),
cost.py (bytes, messages and time in closed form)."""

from .cost import causal_work, crossover_seq_len, ring_traffic, step_seconds
from .layout import positions, shard, unshard
from .ring import RingAttention, merge
from .transform import context_parallel

__all__ = ["RingAttention", "causal_work", "context_parallel", "crossover_seq_len", "merge", "positions",
           "ring_traffic", "shard", "step_seconds", "unshard"]
