"""Diagnosing may_start (the stale-synchronous bound) in its own terms: which worker, how far ahead of the
slowest worker it is, and what the bound s allows.

Worker w, having pushed pushes[w] gradients, may start its next step iff pushes[w] − min_v pushes[v] <= s;
s = None (no bound) lets every worker go. Every pushes vector of 1-3 workers with counts 0-3 is tried,
with s = None, 0, 1, 2: the first case answered wrongly is the message.
"""

import itertools


def expected_start(worker: int, pushes: list[int], bound: int | None) -> bool:
    return bound is None or pushes[worker] - min(pushes) <= bound


def _case(worker: int, pushes: list[int], bound: int | None) -> str:
    slowest = pushes.index(min(pushes))
    ahead = pushes[worker] - pushes[slowest]
    if bound is None:
        return (f"may_start(worker {worker}, pushes={pushes}, bound=None): with no bound every worker may "
                f"start")
    verdict = "within" if ahead <= bound else "more than"
    rule = "so it may start" if ahead <= bound else "so it must wait"
    return (f"may_start(worker {worker}, pushes={pushes}, bound={bound}): worker {worker} has pushed "
            f"{pushes[worker]}, the slowest (worker {slowest}) {pushes[slowest]}: it is {ahead} ahead, "
            f"{verdict} the bound {bound}, {rule}")


def diagnose_may_start(may_start) -> str | None:
    """The first (worker, pushes, bound) that ``may_start`` answers wrongly, in the bound's terms."""
    for workers in (1, 2, 3):
        for bound in (None, 0, 1, 2):
            for counts in itertools.product(range(4), repeat=workers):
                for worker in range(workers):
                    pushes = list(counts)
                    try:
                        got = may_start(worker, pushes, bound)
                    except Exception as err:  # noqa: BLE001 - the message names what was raised
                        return f"{_case(worker, list(counts), bound)}; it raised {type(err).__name__}: {err}"
                    if pushes != list(counts):
                        return f"{_case(worker, list(counts), bound)}; it changed pushes to {pushes}"
                    if got is not expected_start(worker, pushes, bound):
                        return f"{_case(worker, pushes, bound)}; may_start returned {got!r}"
    return None
