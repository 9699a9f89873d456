"""Tensor (intra-layer model) parallelism: transform.py (``tensor_parallel``: split a GPT or a block in
place), layers.py (column- and row-parallel Linear), mlp.py (the Megatron MLP block, whole-MLP
conversions), attention.py (heads split), vocab_parallel.py (embedding, head, loss split by token id),
sequence.py (sequence parallelism), comm.py (Megatron's f and g, feature shards),
cost.py (words moved per step, memory per device)."""

from .attention import TensorParallelAttention
from .comm import (
    CopyToTensorParallel,
    GatherFromTensorParallel,
    ReduceFromTensorParallel,
    allgather_features,
    check_same_on_all_ranks,
    feature_bounds,
    feature_slice,
    group_allreduce,
)
from .cost import (
    column_parallel_words,
    data_parallel_words,
    hybrid_words,
    megatron_words,
    memory_words_per_device,
    seed_t_comm_data,
    seed_t_comm_model,
)
from .layers import ColumnParallelLinear, RowParallelLinear
from .mlp import MegatronMLP, column_parallel_mlp, megatron_parallel_mlp
from .sequence import SequenceShard, sequence_shard
from .transform import tensor_parallel
from .transformer_cost import block_activation_bytes, block_bytes_sent, block_comm_seconds, korthikanti_bytes
from .vocab_parallel import VocabParallelCrossEntropy, VocabParallelEmbedding, VocabParallelHead

__all__ = [
    "ColumnParallelLinear",
    "CopyToTensorParallel",
    "GatherFromTensorParallel",
    "MegatronMLP",
    "ReduceFromTensorParallel",
    "RowParallelLinear",
    "SequenceShard",
    "TensorParallelAttention",
    "VocabParallelCrossEntropy",
    "VocabParallelEmbedding",
    "VocabParallelHead",
    "allgather_features",
    "block_activation_bytes",
    "block_bytes_sent",
    "block_comm_seconds",
    "check_same_on_all_ranks",
    "column_parallel_mlp",
    "column_parallel_words",
    "data_parallel_words",
    "feature_bounds",
    "feature_slice",
    "group_allreduce",
    "hybrid_words",
    "korthikanti_bytes",
    "megatron_parallel_mlp",
    "megatron_words",
    "memory_words_per_device",
    "seed_t_comm_data",
    "seed_t_comm_model",
    "sequence_shard",
    "tensor_parallel",
]
