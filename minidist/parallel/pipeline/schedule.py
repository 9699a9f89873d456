"""Pipeline schedules as data: which stage runs which micro-batch's forward (F) or backward (B) when.

A schedule for P stages and M micro-batches is a list of clock ticks; tick t lists ``Op(stage, kind,
micro_batch)``, at most one per stage (one tick = one F or one B, the textbook picture). Being data, it
can be printed (``format_schedule``), checked (``check_tasks``: each op after its ``dependencies``) and
measured (``bubble_fraction``, ``max_in_flight``) without running anything; pipeline.py runs it.

The three schedules ("Distributed Deep Learning (Part II)" slides, "GPipe: Reduce Bubble
with Micro-Batching", "PipeDream: Use Async Updates to remove Bubble"):

    naive   micro-batch m runs F through every stage and B back before m+1 starts: bubble (P−1)/P
    gpipe   all forwards, then all backwards:  F(s, m) at tick s + m,
            B(s, m) at tick (M + P − 1) + (P − 1 − s) + m;  2(M + P − 1) ticks, bubble (P−1)/(M+P−1)
    1f1b    PipeDream-flush: P − 1 − s forwards to fill, then one forward, one backward, then drain;
            GPipe's ticks and bubble, but at most P − s micro-batches in flight at stage s

Bubble fraction = idle stage-ticks / all stage-ticks = (P·T − 2·P·M) / (P·T) for T ticks.

An ``Op`` *is* a ``Task`` (rank, kind, micro_batch, stage) whose rank is its stage, so tasks.py's tables
(several stages per rank, a split backward) are placed, checked and measured by the same functions.
"""

from __future__ import annotations

from typing import NamedTuple

from minidist.nn.checks import check_count

SCHEDULES = ("naive", "gpipe", "1f1b")   # the tables of this file (every schedule: registry.py)


class Task(NamedTuple):
    """One entry of a table: ``rank`` runs the ``kind`` ("F", "B" or "W") of ``micro_batch`` on ``stage``."""

    rank: int
    kind: str
    micro_batch: int
    stage: int


class Op(Task):
    """A task of a table with one stage per rank: ``Op(stage, kind, micro_batch)`` is the Task
    (rank = stage, kind, micro_batch, stage) — the one table format, spelled as the slides do."""

    __slots__ = ()

    def __new__(cls, stage: int, kind: str, micro_batch: int):
        return super().__new__(cls, stage, kind, micro_batch, stage)

    def __getnewargs__(self):
        return self.stage, self.kind, self.micro_batch


Schedule = list[list[Task]]


def check_sizes(num_stages: int, num_micro_batches: int) -> None:
    check_count(num_stages, "number of stages P")
    check_count(num_micro_batches, "number of micro-batches M")


def naive_schedule(num_stages: int, num_micro_batches: int = 1) -> Schedule:
    """One micro-batch at a time: F on stages 0..P−1, then B on P−1..0, then the next micro-batch."""
    check_sizes(num_stages, num_micro_batches)
    P, M = num_stages, num_micro_batches
    ticks: Schedule = [[] for _ in range(2 * P * M)]
    for m in range(M):
        for s in range(P):
            ticks[2 * P * m + s].append(Op(s, "F", m))
            ticks[2 * P * m + P + (P - 1 - s)].append(Op(s, "B", m))
    return ticks


def gpipe_schedule(num_stages: int, num_micro_batches: int) -> Schedule:
    """GPipe: every forward (a diagonal wave), then every backward (the wave reversed), at the ticks of
    the module docstring; ops within a tick are listed by stage."""
    check_sizes(num_stages, num_micro_batches)
    P, M = num_stages, num_micro_batches
    # BEGIN SOLUTION gpipe_schedule
    ticks: Schedule = [[] for _ in range(2 * (M + P - 1))]
    for s in range(P):
        for m in range(M):
            ticks[s + m].append(Op(s, "F", m))
            ticks[(M + P - 1) + (P - 1 - s) + m].append(Op(s, "B", m))
    for tick in ticks:
        tick.sort()
    return ticks
    # END SOLUTION


def one_f_one_b_orders(num_stages: int, num_micro_batches: int) -> list[list[Op]]:
    """Each stage's op order under 1F1B: P−1−s warm-up forwards, then F/B alternating, then the drain."""
    P, M = num_stages, num_micro_batches
    orders = []
    for s in range(P):
        warmup = min(P - 1 - s, M)
        order = [Op(s, "F", m) for m in range(warmup)]
        next_f, next_b = warmup, 0
        while next_b < M:
            if next_f < M:
                order.append(Op(s, "F", next_f))
                next_f += 1
            order.append(Op(s, "B", next_b))
            next_b += 1
        orders.append(order)
    return orders


def key_of(op) -> tuple[str, int, int]:
    """What an Op (or a tasks.py Task) does, whichever rank runs it: (kind, micro_batch, stage)."""
    return op.kind, op.micro_batch, op.stage


def dependencies(key: tuple[str, int, int], num_stages: int) -> list[tuple[str, int, int]]:
    """The keys the op of key (kind, micro_batch m, stage s) waits for: F(s, m) after F(s−1, m);
    B(s, m) after F(s, m) and B(s+1, m); tasks.py's W(s, m) after B(s, m)."""
    kind, m, s = key
    if kind == "F":
        return [("F", m, s - 1)] if s > 0 else []
    if kind == "W":
        return [("B", m, s)]
    return [("F", m, s)] + ([("B", m, s + 1)] if s < num_stages - 1 else [])


def place_in_ticks(orders: list[list[Op]], num_stages: int | None = None) -> Schedule:
    """Each rank's order of ops -> ticks: every op at the earliest tick after its rank's previous op and
    after the ops it depends on. Also places tasks.py's Tasks (orders per rank, num_stages given; an Op's
    rank is its stage). Raises ValueError if the orders wait on each other (a deadlock)."""
    num_stages = len(orders) if num_stages is None else num_stages
    tick_of: dict[tuple[str, int, int], int] = {}
    position = [0] * len(orders)
    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for r, order in enumerate(orders):
            if position[r] == len(order):
                continue
            op = order[position[r]]
            needs = dependencies(key_of(op), num_stages)
            if any(d not in tick_of for d in needs):
                continue
            earliest = tick_of[key_of(order[position[r] - 1])] + 1 if position[r] else 0
            tick_of[key_of(op)] = max([earliest] + [tick_of[d] + 1 for d in needs])
            position[r] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise ValueError("the orders wait on each other: no op can run (a deadlock)")
    return to_ticks([(op, tick_of[key_of(op)]) for order in orders for op in order])


def to_ticks(placed: list[tuple[Op, int]]) -> Schedule:
    """(op, tick) pairs -> the list of ticks, each tick's ops by rank."""
    ticks: Schedule = [[] for _ in range(max(t for _, t in placed) + 1)]
    for op, t in sorted(placed, key=lambda item: (item[1], item[0].rank)):
        ticks[t].append(op)
    return ticks


def one_f_one_b_schedule(num_stages: int, num_micro_batches: int) -> Schedule:
    """1F1B (PipeDream-flush): GPipe's ticks and bubble, at most P − s micro-batches held at stage s."""
    check_sizes(num_stages, num_micro_batches)
    return place_in_ticks(one_f_one_b_orders(num_stages, num_micro_batches))


def stage_ops(schedule: Schedule, stage: int) -> list[Op]:
    """The ops stage runs, in tick order (what the executor follows on rank = stage); of a tasks.py
    table, the tasks rank ``stage`` runs."""
    return [op for tick in schedule for op in tick if op.rank == stage]


def check_tasks(schedule: Schedule, num_ranks: int, num_stages: int, num_micro_batches: int) -> None:
    """Raise ValueError unless every (micro-batch, stage) runs F and B once (and W once, if any task is a
    W), all on one rank, at most one task per rank and tick, each after the tasks it depends on. A table of
    Ops (stage s on rank s) is checked with num_ranks = num_stages = P."""
    check_count(num_ranks, "number of ranks")
    check_sizes(num_stages, num_micro_batches)
    tick_of: dict[tuple[str, int, int], int] = {}
    rank_of: dict[tuple[int, int], int] = {}
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
            if key_of(task) in tick_of:
                raise ValueError(f"{task} runs twice (ticks {tick_of[key_of(task)]} and {t})")
            if rank_of.setdefault((task.micro_batch, task.stage), task.rank) != task.rank:
                raise ValueError(f"{task}: micro-batch {task.micro_batch}'s stage {task.stage} also runs on "
                                 f"rank {rank_of[task.micro_batch, task.stage]}")
            tick_of[key_of(task)] = t
    kinds = "FBW" if any(kind == "W" for kind, _, _ in tick_of) else "FB"
    every = [(kind, m, s) for m in range(num_micro_batches) for s in range(num_stages) for kind in kinds]
    for key in every:
        if key not in tick_of:
            raise ValueError(f"{key[0]}(micro-batch {key[1]}, stage {key[2]}) never runs")
    for key in every:
        for dep in dependencies(key, num_stages):
            if tick_of[dep] >= tick_of[key]:
                raise ValueError(f"{key} at tick {tick_of[key]} does not come after {dep} at tick "
                                 f"{tick_of[dep]}")


def max_in_flight(schedule: Schedule, num_stages: int, until: str = "B") -> list[int]:
    """Per stage (per rank, for a tasks.py table), the most micro-batches whose F has run and whose
    ``until`` op has not: the activations held. With a split backward (tasks.py), until="B" counts the
    activations B needs, until="W" what W still holds."""
    held, peak = [0] * num_stages, [0] * num_stages
    for tick in schedule:
        for op in tick:
            held[op.rank] += 1 if op.kind == "F" else -1 if op.kind == until else 0
            peak[op.rank] = max(peak[op.rank], held[op.rank])
    return peak


def bubble_fraction(schedule: Schedule, num_stages: int) -> float:
    """Idle stage-ticks / all stage-ticks, counting a tick as one unit for F and B alike."""
    busy = sum(len(tick) for tick in schedule)
    return 1.0 - busy / (num_stages * len(schedule))


def format_schedule(schedule: Schedule, num_stages: int) -> str:
    """A text timeline: one row per stage, one column per tick ("F3" / "B3", "." when idle)."""
    width = max(3, 1 + max((len(str(op.micro_batch)) for tick in schedule for op in tick), default=1))
    return format_rows(schedule, num_stages, "stage", lambda op: f"{op.kind}{op.micro_batch}", width)


def format_rows(schedule: Schedule, num_ranks: int, name: str, cell, width: int) -> str:
    """One row per rank ("<name> r: "), one column per tick: cell(op), or "." when idle; width chars."""
    rows = []
    for r in range(num_ranks):
        cells = ["."] * len(schedule)
        for t, tick in enumerate(schedule):
            for op in tick:
                if op.rank == r:
                    cells[t] = cell(op)
        rows.append(f"{name} {r}: " + "".join(c.ljust(width) for c in cells))
    return "\n".join(rows)
