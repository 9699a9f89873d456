"""Training that does not wait for the slowest worker: schedule.py (stragglers' step times, the exercise
``may_start``: the stale-synchronous bound, the servers' push order), parameter_server.py (Downpour SGD, its
replay), momentum.py (asynchrony begets momentum), periodic.py (local SGD, EASGD), hogwild.py (lock-free)."""

from .hogwild import hogwild, sparse_problem
from .momentum import best_momentum, implicit_momentum, least_squares, sweep_momentum
from .parameter_server import replay_parameter_server, train_parameter_server
from .periodic import easgd_schedule, train_elastic, train_elastic_async, train_local_sgd
from .schedule import check_bound, may_start, ps_schedule, step_seconds

__all__ = ["best_momentum", "check_bound", "easgd_schedule", "hogwild", "implicit_momentum", "least_squares",
           "may_start", "ps_schedule", "replay_parameter_server", "sparse_problem", "step_seconds",
           "sweep_momentum", "train_elastic", "train_elastic_async", "train_local_sgd",
           "train_parameter_server"]
