"""Pipeline parallelism: pipeline.py (the stage and its executor), schedule.py (naive, GPipe, 1F1B as
tables of ticks), tasks.py (tables with several stages per rank and a split backward: interleaved.py,
zero_bubble.py, chimera.py; run by tasks_executor.py, the B/W split in split_backward.py), split.py (cutting a
Sequential into stages), comm.py (point-to-point between stages, and StageLinks: 1F1B's sendrecv pairing),
ledger.py (the stage's clock, timeline and memory books)."""

from .chimera import chimera_schedule
from .comm import (
    recv_activation,
    recv_gradient,
    send_activation,
    send_activation_recv_gradient,
    send_gradient,
    send_gradient_recv_activation,
)
from .interleaved import interleaved_schedule
from .pipeline import Pipeline
from .schedule import (
    SCHEDULES,
    Op,
    Schedule,
    bubble_fraction,
    check_schedule,
    format_schedule,
    gpipe_schedule,
    make_schedule,
    max_in_flight,
    naive_schedule,
    one_f_one_b_schedule,
    stage_ops,
)
from .split import check_boundaries, layer_costs, split_by_cost, split_by_layers, stage_costs
from .tasks import Task, TaskSchedule, check_tasks, format_tasks
from .tasks_executor import TaskPipeline
from .zero_bubble import zero_bubble_schedule

__all__ = [
    "SCHEDULES",
    "Op",
    "Pipeline",
    "Schedule",
    "Task",
    "TaskPipeline",
    "TaskSchedule",
    "bubble_fraction",
    "check_boundaries",
    "check_schedule",
    "check_tasks",
    "chimera_schedule",
    "format_schedule",
    "format_tasks",
    "gpipe_schedule",
    "interleaved_schedule",
    "layer_costs",
    "make_schedule",
    "max_in_flight",
    "naive_schedule",
    "one_f_one_b_schedule",
    "recv_activation",
    "recv_gradient",
    "send_activation",
    "send_activation_recv_gradient",
    "send_gradient",
    "send_gradient_recv_activation",
    "split_by_cost",
    "split_by_layers",
    "stage_costs",
    "stage_ops",
    "zero_bubble_schedule",
]
