"""Training that does not wait for the slowest worker: parameter servers, Hogwild!, elastic and local SGD.

schedule.py          step_seconds: stragglers on the clock; may_start: the stale-synchronous bound (an
                     exercise); ps_schedule: the order in which servers take pushes
parameter_server.py  train_parameter_server: Downpour SGD, asynchronous or stale-synchronous; its replay
momentum.py          sweep_momentum: asynchrony begets (implicit) momentum
periodic.py          train_local_sgd, train_elastic(_async): average every H steps, or pull to a center
hogwild.py           hogwild: lock-free SGD on a shared array (real processes, real parallelism)
"""

from .hogwild import hogwild, sparse_problem
from .momentum import best_momentum, implicit_momentum, least_squares, sweep_momentum
from .parameter_server import replay_parameter_server, train_parameter_server
from .periodic import easgd_schedule, train_elastic, train_elastic_async, train_local_sgd
from .schedule import check_bound, may_start, ps_schedule, step_seconds

__all__ = [
    "best_momentum", "check_bound", "easgd_schedule", "hogwild", "implicit_momentum", "least_squares",
    "may_start", "ps_schedule", "replay_parameter_server", "sparse_problem", "step_seconds", "sweep_momentum",
    "train_elastic", "train_elastic_async", "train_local_sgd", "train_parameter_server",
]
