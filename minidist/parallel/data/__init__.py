"""Data parallelism: naive.py (NaiveDataParallel, one allreduce per parameter: read it first),
data_parallel.py (DataParallel), buckets.py (gradient buckets, GradientReadiness: when they are complete
during backward and the partial sums then, and one bucket's allreduce), replicas.py (the
replicas-are-identical checks), ../shards.py (a rank's slice of the batch, loss weights), overlap.py
(communication overlapping backward, in closed form), sync.py (GradientSync: DDP's attachment, each bucket
allreduced when ready), ../sync_batchnorm.py (batch statistics over the global batch); ZeRO: flat.py
(shards of flat parameter groups), zero_sync.py (ZeroSync: ZeRO 1-3's attachment, reduce-scatter and the
sharded step), zero.py (ZeRO: stages 1-3 on a step runner, 3 = FSDP), zero_mixed.py (fp32 master shards
for mixed precision)."""

from ..shards import ShardWeightedLoss
from ..sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm
from .buckets import GradientReadiness
from .data_parallel import DataParallel
from .naive import NaiveDataParallel
from .sync import GradientSync
from .zero import ZeRO
from .zero_mixed import ShardedMixedPrecision
from .zero_sync import ZeroSync

__all__ = [
    "DataParallel",
    "GradientReadiness",
    "GradientSync",
    "NaiveDataParallel",
    "ShardWeightedLoss",
    "ShardedMixedPrecision",
    "SyncBatchNorm",
    "ZeRO",
    "ZeroSync",
    "convert_sync_batchnorm",
]
