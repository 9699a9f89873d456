"""Pipeline parallelism: pipeline.py (the one executor: a rank's stages and its row of a table),
schedule.py (the table format, Task/Op, and naive, GPipe, 1F1B as tables of ticks), tasks.py (tables with
several stages per rank and a split backward: interleaved.py, zero_bubble.py, chimera.py; the B/W split in
split_backward.py), registry.py (schedule name -> table), split.py (cutting a Sequential into stages),
comm.py (point-to-point between stages, 1F1B's sendrecv pairing), ledger.py (the clock, timeline and
memory books)."""

from .chimera import chimera_schedule
from .interleaved import interleaved_schedule
from .pipeline import Pipeline
from .registry import SCHEDULES, make_schedule
from .schedule import (
    Op,
    Schedule,
    bubble_fraction,
    check_schedule,
    format_schedule,
    gpipe_schedule,
    max_in_flight,
    naive_schedule,
    one_f_one_b_schedule,
    stage_ops,
)
from .split import check_boundaries, layer_costs, split_by_cost, split_by_layers, stage_costs
from .tasks import Task, check_tasks, format_tasks
from .zero_bubble import zero_bubble_schedule

__all__ = [
    "SCHEDULES",
    "Op",
    "Pipeline",
    "Schedule",
    "Task",
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
    "split_by_cost",
    "split_by_layers",
    "stage_costs",
    "stage_ops",
    "zero_bubble_schedule",
]
