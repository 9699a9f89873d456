"""Tensor (intra-layer model) parallelism: transform.py (``tensor_parallel``: split a GPT or a block in
place), layers.py (column- and row-parallel Linear), mlp.py (the Megatron MLP block, whole-MLP
conversions), attention.py (heads split), vocab_parallel.py (embedding, head, loss split by token id),
sequence.py (sequence parallelism), comm.py (Megatron's f and g, feature shards),
cost.py (words moved per step, memory per device), transformer_cost.py (a block's bytes and memory)."""

from .comm import feature_slice
from .layers import ColumnParallelLinear, RowParallelLinear
from .mlp import MegatronMLP, column_parallel_mlp, megatron_parallel_mlp
from .sequence import sequence_shard
from .transform import tensor_parallel
from .transformer_cost import block_activation_bytes, block_bytes_sent, block_comm_seconds
from .vocab_parallel import VocabParallelCrossEntropy, VocabParallelEmbedding

__all__ = ["ColumnParallelLinear", "MegatronMLP", "RowParallelLinear", "VocabParallelCrossEntropy",
           "VocabParallelEmbedding", "block_activation_bytes", "block_bytes_sent", "block_comm_seconds",
           "column_parallel_mlp", "feature_slice", "megatron_parallel_mlp", "sequence_shard",
           "tensor_parallel"]
