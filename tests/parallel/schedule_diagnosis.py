"""Diagnosing gpipe_schedule in its own terms: which stage, which task (F or B of which micro-batch), at
which tick it should run and where it is (or that it is missing, twice, or a tick is out of stage order).

GPipe's ticks, written out here: F(s, m) at tick s + m (the forward wave), B(s, m) at tick
(M + P − 1) + (P − 1 − s) + m (the wave reversed), 2(M + P − 1) ticks in all, each tick's ops by stage.
"""


def gpipe_tick(stage: int, kind: str, micro_batch: int, P: int, M: int) -> tuple[int, str]:
    """(the tick of this task, why) in GPipe's schedule for P stages and M micro-batches."""
    if kind == "F":
        return stage + micro_batch, f"forward wave: tick s + m = {stage} + {micro_batch}"
    return ((M + P - 1) + (P - 1 - stage) + micro_batch,
            f"backward wave after all {M + P - 1} forward ticks: (M + P − 1) + (P − 1 − s) + m = "
            f"{M + P - 1} + {P - 1 - stage} + {micro_batch}")


def diagnose_gpipe(gpipe_schedule) -> str | None:
    """The first stage and task gpipe_schedule(P, M) places wrongly, for a few (P, M)."""
    for P, M in ((2, 3), (3, 2), (1, 2), (4, 4)):
        what = f"gpipe_schedule(P={P}, M={M})"
        ticks = gpipe_schedule(P, M)
        where: dict[tuple, list[int]] = {}
        for t, tick in enumerate(ticks):
            for op in tick:
                where.setdefault((op.stage, op.kind, op.micro_batch), []).append(t)
        for s in range(P):
            for kind in ("F", "B"):
                for m in range(M):
                    want, why = gpipe_tick(s, kind, m, P, M)
                    got = where.pop((s, kind, m), [])
                    if got != [want]:
                        at = ", ".join(map(str, got))
                        seen = "it is missing" if not got else f"it is at tick{'s' * (len(got) > 1)} {at}"
                        return (f"{what}: stage {s}, {kind} of micro-batch {m} should be at tick {want} "
                                f"({why}); {seen}")
        if where:
            return f"{what}: tasks that GPipe does not have: {sorted(where)[:3]}"
        if len(ticks) != 2 * (M + P - 1):
            return f"{what}: {len(ticks)} ticks, expected 2(M + P − 1) = {2 * (M + P - 1)}"
        for t, tick in enumerate(ticks):
            if [op.stage for op in tick] != sorted(op.stage for op in tick):
                return f"{what}: tick {t} lists stages {[op.stage for op in tick]}; list them by stage"
    return None
