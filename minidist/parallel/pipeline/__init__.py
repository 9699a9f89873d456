"""Pipeline parallelism: pipeline.py (the one executor: a rank's stages and its row of a table, with its
clock, timeline and memory books), schedule.py (the table format, Task/Op, and naive, GPipe, 1F1B as
tables of ticks), tasks.py (tables with several stages per rank and a split backward: interleaved.py,
zero_bubble.py with the B/W split, chimera.py), registry.py (schedule name -> table), boundaries.py
(cutting a Sequential into stages), comm.py (point-to-point between stages, 1F1B's sendrecv pairing);
PipeDream: pipedream.py (its formulas), weight_stash.py (on the cluster)."""

from .pipeline import Pipeline
from .registry import make_schedule
from .schedule import bubble_fraction, format_schedule, max_in_flight, one_f_one_b_schedule, stage_ops

__all__ = ["Pipeline", "bubble_fraction", "format_schedule", "make_schedule", "max_in_flight",
           "one_f_one_b_schedule", "stage_ops"]
