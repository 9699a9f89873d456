"""The schedule registry: a schedule's name -> the function that builds its table (one table format:
ticks of Tasks, schedule.py). The executor (pipeline.py), parallelize and the planner read the names here;
a new schedule is one function and one line below.

    make_schedule("1f1b", 4, 8)                 # P = 4 ranks, M = 8 micro-batches
    make_schedule("interleaved", 4, 8, chunks=2)  # v chunks per rank: P·v stages
"""

from __future__ import annotations

from collections.abc import Callable

from .chimera import chimera_schedule
from .interleaved import interleaved_schedule
from .schedule import Schedule, gpipe_schedule, naive_schedule, one_f_one_b_schedule
from .zero_bubble import zero_bubble_schedule

SCHEDULES: dict[str, Callable[..., Schedule]] = {     # (P ranks, M micro-batches, chunks v) -> table
    "naive": lambda P, M, chunks=1: naive_schedule(P, M),
    "gpipe": lambda P, M, chunks=1: gpipe_schedule(P, M),
    "1f1b": lambda P, M, chunks=1: one_f_one_b_schedule(P, M),
    "interleaved": lambda P, M, chunks=2: interleaved_schedule(P, M, chunks),
    "zb-h1": lambda P, M, chunks=1: zero_bubble_schedule(P, M),
    "chimera": lambda P, M, chunks=1: chimera_schedule(P, M),
    "pipedream": lambda P, M, chunks=1: one_f_one_b_schedule(P, M),   # over a stream: weight_stash.py
}

# One optimizer step per table (PipeDream updates after every backward: weight_stash.PipeDream).
SYNCHRONOUS = tuple(name for name in SCHEDULES if name != "pipedream")
# The schedules the planner prices: the synchronous ones that hold at most P micro-batches (not naive, GPipe).
PLANNED = tuple(name for name in SYNCHRONOUS if name not in ("naive", "gpipe"))


def make_schedule(name: str, num_ranks: int, num_micro_batches: int, **options) -> Schedule:
    """The table of schedule ``name`` for P ranks and M micro-batches (options: chunks=v, interleaved)."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {name!r}: expected one of {tuple(SCHEDULES)}")
    return SCHEDULES[name](num_ranks, num_micro_batches, **options)

