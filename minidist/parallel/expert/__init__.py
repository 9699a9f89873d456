"""Expert parallelism: transform.py (``expert_parallel``: split a Switch Transformer in place),
expert_parallel.py (experts spread over ranks, all-to-all dispatch and combine), cost.py (all-to-all
bytes, the slowest expert's time)."""

from .expert_parallel import ExpertParallelMoE
from .transform import expert_parallel

__all__ = ["ExpertParallelMoE", "expert_parallel"]
