"""Expert parallelism: transform.py (``expert_parallel``: split a Switch Transformer in place),
expert_parallel.py (experts spread over ranks, all-to-all dispatch and combine), replicas.py (the
data-parallel average of the replicated parameters), cost.py (all-to-all bytes, the slowest expert's
time)."""

from .expert_parallel import ExpertParallelMoE
from .replicas import AverageGradients, average_gradients, expert_parameters, replicated_parameters
from .transform import expert_parallel

__all__ = ["AverageGradients", "ExpertParallelMoE", "average_gradients", "expert_parameters",
           "expert_parallel", "replicated_parameters"]
