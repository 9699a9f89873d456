"""Data parallelism: naive.py (NaiveDataParallel, one allreduce per parameter: read it first),
data_parallel.py (DataParallel), comm.py (gradient buckets and their allreduce), replicas.py (the
replicas-are-identical checks), ../shards.py (a rank's slice of the batch, loss weights), overlap.py
(communication overlapping backward, in closed form), sync.py (GradientSync: the one runner attachment
that sums partial gradients and reduces over the replicas, bucketed or sharded), ../sync_batchnorm.py
(batch statistics over the global batch); ZeRO: flat.py (shards of flat parameter groups), sharded.py
(what the stages share), zero.py (stages 1-2), fsdp.py (stage 3), zero_mixed.py (fp32 master shards
for mixed precision)."""

from minidist.plots import plot_overlap  # drawing lives in minidist.plots; kept here by its old name

from ..shards import ShardWeightedLoss
from ..sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm
from .comm import DEFAULT_BUCKET_BYTES, Bucket, allreduce_bucket, assign_buckets, ready_layers
from .data_parallel import DataParallel
from .fsdp import FSDP
from .naive import NaiveDataParallel
from .overlap import comm_spans, save_overlap_chrome, step_time
from .replicas import check_same_layout, check_same_values, parameter_digest, parameter_signature
from .sync import GradientSync
from .zero import ZeRO, zero1_shard_update, zero_data_parallel
from .zero_mixed import ShardedMixedPrecision

__all__ = [
    "ShardedMixedPrecision",
    "FSDP",
    "GradientSync",
    "ZeRO",
    "zero1_shard_update",
    "zero_data_parallel",
    "SyncBatchNorm",
    "convert_sync_batchnorm",
    "DEFAULT_BUCKET_BYTES",
    "Bucket",
    "DataParallel",
    "NaiveDataParallel",
    "ShardWeightedLoss",
    "allreduce_bucket",
    "assign_buckets",
    "check_same_layout",
    "check_same_values",
    "comm_spans",
    "parameter_digest",
    "parameter_signature",
    "plot_overlap",
    "ready_layers",
    "save_overlap_chrome",
    "step_time",
]
