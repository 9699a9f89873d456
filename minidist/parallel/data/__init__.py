"""Data parallelism and ZeRO, each module's docstring its chapter: read naive.py (NaiveDataParallel, one
allreduce per parameter) first, then data_parallel.py (DataParallel on the DDP attachment sync.py, its
buckets buckets.py, their overlap overlap.py, the first layers' update delayed a step delayed.py), then
zero.py (ZeRO 1-3 on the attachment zero_sync.py, its shards flat.py, mixed precision zero_mixed.py);
../shards.py slices the batch, ../sync_batchnorm.py normalises over the global batch."""

from ..shards import ShardWeightedLoss
from ..sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm
from .buckets import GradientReadiness
from .data_parallel import DataParallel
from .delayed import DelayedUpdate
from .naive import NaiveDataParallel
from .sync import GradientSync
from .zero import ZeRO
from .zero_mixed import ShardedMixedPrecision
from .zero_sync import ZeroSync

__all__ = ["DataParallel", "DelayedUpdate", "GradientReadiness", "GradientSync", "NaiveDataParallel",
           "ShardWeightedLoss", "ShardedMixedPrecision", "SyncBatchNorm", "ZeRO", "ZeroSync",
           "convert_sync_batchnorm"]
