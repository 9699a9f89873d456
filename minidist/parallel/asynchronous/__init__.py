"""Training that does not wait for the slowest worker: parameter servers, Hogwild!, elastic and local SGD.

stragglers.py        step_seconds: per-worker, per-step compute times on the simulated clock
staleness.py         may_start: the stale-synchronous bound (an exercise)
schedule.py          ps_schedule: the order in which parameter servers take pushes, on the clock
parameter_server.py  train_parameter_server: Downpour SGD, asynchronous or stale-synchronous
momentum.py          replay_parameter_server, sweep_momentum: asynchrony begets (implicit) momentum
local_sgd.py         train_local_sgd: average the models every H steps
elastic.py           train_elastic: elastic averaging SGD with a center variable
elastic_async.py     train_elastic_async, easgd_schedule: asynchronous EASGD, a center rank, no barrier
hogwild.py           hogwild: lock-free SGD on a shared array (real processes, real parallelism)
"""

from .elastic import train_elastic
from .elastic_async import Exchange, easgd_schedule, train_elastic_async
from .hogwild import SparseProblem, hogwild, sparse_problem
from .local_sgd import train_local_sgd
from .momentum import best_momentum, implicit_momentum, least_squares, replay_parameter_server, sweep_momentum
from .parameter_server import train_parameter_server
from .schedule import PSSchedule, Push, ps_schedule
from .staleness import check_bound, may_start
from .stragglers import step_seconds

__all__ = [
    "Exchange",
    "PSSchedule",
    "Push",
    "SparseProblem",
    "best_momentum",
    "check_bound",
    "easgd_schedule",
    "hogwild",
    "implicit_momentum",
    "least_squares",
    "may_start",
    "ps_schedule",
    "replay_parameter_server",
    "sparse_problem",
    "step_seconds",
    "sweep_momentum",
    "train_elastic",
    "train_elastic_async",
    "train_local_sgd",
    "train_parameter_server",
]
