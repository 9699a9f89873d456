"""Data parallelism: naive.py (NaiveDataParallel, one allreduce per parameter: read it first),
data_parallel.py (DataParallel), buckets.py (gradient buckets, GradientReadiness: when they are complete
during backward and the partial sums then, and one bucket's allreduce), replicas.py (the
replicas-are-identical checks), ../shards.py (a rank's slice of the batch, loss weights), overlap.py
(communication overlapping backward, in closed form), sync.py (GradientSync: DDP's attachment, each bucket
allreduced when ready), ../sync_batchnorm.py (batch statistics over the global batch); ZeRO: flat.py
(shards of flat parameter groups), zero_sync.py (ZeroSync: ZeRO 1-3's attachment, reduce-scatter and the
sharded step), sharded.py (what the wrappers share), zero.py (stages 1-2), fsdp.py (stage 3),
zero_mixed.py (fp32 master shards for mixed precision)."""

from ..shards import ShardWeightedLoss
from ..sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm
from .buckets import (
    DEFAULT_BUCKET_BYTES,
    Bucket,
    GradientReadiness,
    allreduce_bucket,
    assign_buckets,
    ready_layers,
)
from .data_parallel import DataParallel
from .fsdp import FSDP
from .naive import NaiveDataParallel
from .overlap import comm_spans, save_overlap_chrome, step_time
from .replicas import check_same_layout, check_same_values, parameter_digest, parameter_signature
from .sync import GradientSync
from .zero import ZeRO, zero1_shard_update, zero_data_parallel
from .zero_mixed import ShardedMixedPrecision
from .zero_sync import ZeroSync

__all__ = [
    "ShardedMixedPrecision",
    "FSDP",
    "GradientReadiness",
    "GradientSync",
    "ZeRO",
    "ZeroSync",
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
    "ready_layers",
    "save_overlap_chrome",
    "step_time",
]
