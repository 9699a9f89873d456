"""Diagnosing interleaved_orders in its own terms: which rank, which place in its order (and the tick the
interleaved schedule runs it at), which task it should be and why (the phase, k, chunk and micro-batch).

Megatron's interleaved 1F1B, written out here: rank r runs w = min(v·M, 2(P − r − 1) + (v − 1)·P) warm-up
forwards, then v·M − w pairs of (forward w + j, backward j), then the remaining backwards. The k-th forward
runs chunk c = (k mod P·v) // P, i.e. stage c·P + r, on micro-batch (k // P·v)·P + k mod P; the k-th
backward the same with chunk v − 1 − c.
"""

from minidist.parallel.pipeline.schedule import Task, place_in_ticks

CASES = ((2, 2, 2), (2, 4, 3), (3, 3, 2), (1, 2, 2), (4, 4, 1))      # (P, M, v): M a multiple of P


def kth_task(r: int, kind: str, k: int, P: int, v: int) -> tuple[Task, str]:
    """Rank r's k-th forward or backward and how it follows from k."""
    chunk = (k % (P * v)) // P
    why = f"chunk (k mod P·v) // P = {chunk}"
    if kind == "B":
        chunk, why = v - 1 - chunk, f"chunk v − 1 − (k mod P·v) // P = {v - 1 - chunk}"
    micro_batch = (k // (P * v)) * P + k % P
    return (Task(r, kind, micro_batch, chunk * P + r),
            f"{why}, stage c·P + r = {chunk * P + r}, micro-batch (k // P·v)·P + k mod P = {micro_batch}")


def megatron_order(r: int, P: int, M: int, v: int) -> list[tuple[Task, str]]:
    """Rank r's (task, why) in order."""
    total = v * M
    warmup = min(total, 2 * (P - r - 1) + (v - 1) * P)
    phases = [("F", k, f"warm-up forward k = {k} of w = {warmup}") for k in range(warmup)]
    for j in range(total - warmup):
        phases += [("F", warmup + j, f"steady-state forward k = {warmup + j}"),
                   ("B", j, f"steady-state backward k = {j}")]
    phases += [("B", k, f"drain backward k = {k}") for k in range(total - warmup, total)]
    order = []
    for kind, k, phase in phases:
        task, why = kth_task(r, kind, k, P, v)
        order.append((task, f"{phase}: {why}"))
    return order


def show(task) -> str:
    return f"{task.kind} of micro-batch {task.micro_batch} on stage {task.stage}" \
        if isinstance(task, Task) else repr(task)


def diagnose_interleaved(interleaved_orders) -> str | None:
    """The first rank and place in its order that interleaved_orders(P, M, v) gets wrong, for a few cases."""
    for P, M, v in CASES:
        what = f"interleaved_orders(P={P}, M={M}, v={v})"
        orders = interleaved_orders(P, M, v)
        if len(orders) != P:
            return f"{what}: {len(orders)} orders, expected one per rank (P = {P})"
        wanted = [megatron_order(r, P, M, v) for r in range(P)]
        placed = place_in_ticks([[task for task, _ in order] for order in wanted], P * v)
        tick_of = {task: t for t, tick in enumerate(placed) for task in tick}
        for r, (got, want) in enumerate(zip(orders, wanted, strict=True)):
            got = list(got)
            for i, (task, why) in enumerate(want):
                seen = show(got[i]) if i < len(got) else f"missing: the order ends after {len(got)} tasks"
                if i >= len(got) or got[i] != task:
                    return (f"{what}: rank {r}, task {i} of its order (tick {tick_of[task]} of the "
                            f"interleaved schedule) should be {show(task)} ({why}); it is {seen}")
            if len(got) > len(want):
                return (f"{what}: rank {r} has {len(got)} tasks, expected v·M forwards and v·M backwards "
                        f"= {len(want)}; the first extra is {show(got[len(want)])}")
    return None
