"""Pipeline schedules beyond one stage per rank and one backward: tables of tasks.

schedule.py's ``Task(rank, kind, micro_batch, stage)`` names what the newer schedules need: a rank
holding several stages (v virtual stages per rank, interleaved; two pipelines in opposite directions,
Chimera), and "W" tasks (the weight gradient; "B" is then the input gradient only: zero-bubble).

The tasks of (m, k) run on one rank, which holds m's activations from F until its last backward task (B,
or W when split). schedule.py places, checks and measures a table of tasks as one of Ops; here
``greedy_tasks`` lets each rank pick, tick by tick, the ready task it prefers.
"""

from __future__ import annotations

from collections.abc import Callable

from .schedule import Schedule, Task, dependencies, format_rows, key_of, to_ticks


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
