"""Pipeline schedules beyond one stage per rank and one backward: tables of tasks.

schedule.py's tables give each rank one stage and one backward op. The newer schedules need two more
things, so a ``Task`` names them:

    Task(rank, kind, micro_batch, stage)
        rank    the device that runs it
        stage   the model's stage (0..S−1): with v virtual stages per rank (interleaved) or two
                pipelines in opposite directions (Chimera) a rank holds several stages
        kind    "F" forward; "B" backward — the whole backward, or only the input gradient when the
                schedule also has "W" tasks (the weight gradient, zero-bubble schedules)

A schedule is a list of ticks, each a list of Tasks, at most one per rank (one tick = one task). The rules
(``check_tasks``): F(m, k) after F(m, k−1); B(m, k) after F(m, k) and B(m, k+1); W(m, k) after B(m, k); the
tasks of (m, k) run on one rank. Bubble fraction = idle rank-ticks / all rank-ticks. A rank holds the
activations of (m, k) from F(m, k) until its last backward task (B, or W when split):
schedule.py's ``max_in_flight`` counts them.

schedule.py's ``place_in_ticks`` turns each rank's order of tasks into ticks (each task as early as its rank
and its dependencies allow); ``greedy_tasks`` lets each rank pick, tick by tick, the ready task it prefers.
Placing, checking the order and measuring are schedule.py's functions (``place_in_ticks``,
``check_order``, ``bubble_fraction``, ``max_in_flight``, ``stage_ops``: a rank's tasks in tick order): they
read a task's rank and stage as they read an Op's; a table of tasks is a ``Schedule``.
"""

from __future__ import annotations

from collections.abc import Callable

from .schedule import (
    Schedule,
    Task,
    check_order,
    dependencies,
    format_rows,
    key_of,
    to_ticks,
)


def check_positive(**values: int) -> None:
    """Raise ValueError unless every value is an int >= 1 (the name says which)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def greedy_tasks(tasks_by_rank: list[list[Task]], num_stages: int,
                 prefer: Callable[[Task], tuple], limit: list[int] | None = None) -> Schedule:
    """Tick by tick, each rank runs its most preferred ready task (smallest ``prefer(task)``).

    limit[r]: the most (micro-batch, stage) activations rank r may hold from F to B; an F that would exceed
    it waits (a W frees only the little its weight gradient needs: the layers' inputs and output gradients).
    """
    done: dict[tuple[str, int, int], int] = {}
    pending = [sorted(tasks, key=prefer) for tasks in tasks_by_rank]
    held = [0] * len(tasks_by_rank)
    placed, t = [], 0
    while any(pending):
        ran = []
        for r, tasks in enumerate(pending):
            for task in tasks:
                if any(done.get(d, t) >= t for d in dependencies(key_of(task), num_stages)):
                    continue
                if task.kind == "F" and limit is not None and held[r] >= limit[r]:
                    continue
                ran.append(task)
                tasks.remove(task)
                held[r] += 1 if task.kind == "F" else -1 if task.kind == "B" else 0
                break
        if not ran:
            raise ValueError("no rank can run a task (the limits leave no room): a deadlock")
        for task in ran:
            done[key_of(task)] = t
            placed.append((task, t))
        t += 1
    return to_ticks(placed)


def from_ops(schedule: Schedule) -> Schedule:
    """A schedule.py table (stage s on rank s) as plain Tasks (an Op already is one: kept for old code)."""
    return [[Task(*op) for op in tick] for tick in schedule]


def check_tasks(schedule: Schedule, num_ranks: int, num_stages: int, num_micro_batches: int) -> None:
    """Raise ValueError unless every (micro-batch, stage) runs F and B once (and W once, if any task is a
    W), all on one rank, at most one task per rank and tick, each after the tasks it depends on."""
    check_positive(num_ranks=num_ranks, num_stages=num_stages, num_micro_batches=num_micro_batches)
    for t, tick in enumerate(schedule):
        ranks = [task.rank for task in tick]
        if len(ranks) != len(set(ranks)):
            raise ValueError(f"tick {t} gives one rank two tasks: {tick}")
        for task in tick:
            if not isinstance(task, Task) or task.kind not in ("F", "B", "W") \
                    or not 0 <= task.rank < num_ranks \
                    or not 0 <= task.stage < num_stages or not 0 <= task.micro_batch < num_micro_batches:
                raise ValueError(f"tick {t}: {task!r} is not a Task(rank < {num_ranks}, 'F'|'B'|'W', "
                                 f"micro_batch < {num_micro_batches}, stage < {num_stages})")
    check_order(schedule, num_stages, num_micro_batches)


def format_tasks(schedule: Schedule, num_ranks: int) -> str:
    """One row per rank, one column per tick: "F3" (micro-batch 3), with ".k" for the stage when a rank
    holds several stages; "." when idle."""
    stages = {(task.rank, task.stage) for tick in schedule for task in tick}
    several = len(stages) > num_ranks

    def cell(task: Task) -> str:
        return f"{task.kind}{task.micro_batch}" + (f".{task.stage}" if several else "")

    width = 1 + max((len(cell(task)) for tick in schedule for task in tick), default=2)
    return format_rows(schedule, num_ranks, "rank", cell, width)


def replay(schedule: Schedule, duration: Callable[[Task], float]) -> dict[Task, tuple[float, float]]:
    """(start, end) of every task when each takes duration(task) seconds and starts as soon as its rank's
    previous task and the tasks it depends on have ended (messages free): the timeline a cluster with free
    links measures, which the unit-tick table only approximates when F, B and W take different times."""
    num_stages = 1 + max(task.stage for tick in schedule for task in tick)
    ended: dict[tuple[str, int, int], float] = {}
    rank_free: dict[int, float] = {}
    times = {}
    for tick in schedule:   # tick order: a task's dependencies and its rank's earlier tasks come first
        for task in tick:
            needs = dependencies(key_of(task), num_stages)
            start = max([rank_free.get(task.rank, 0.0)] + [ended[d] for d in needs])
            times[task] = (start, start + duration(task))
            ended[key_of(task)] = rank_free[task.rank] = times[task][1]
    return times
