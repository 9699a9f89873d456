"""The stale-synchronous bound: a worker may run at most s steps ahead of the slowest one.

Ho et al.'s stale synchronous parallel model, on a parameter server (Dean et al., "Large Scale
Distributed Deep Networks"; the "Hardware Accelerators for Training DNNs" slides: "Asynchronous SGD ...
staleness of updates"). Worker w has pushed pushes[w] gradients. It may start its next step when

    pushes[w] − min_v pushes[v] <= s

s = 0 is synchronous SGD (nobody starts step k + 1 before everybody finished step k); s = None means no
bound at all (fully asynchronous). The staleness of an update is how many updates the server applied
between the worker's pull and the arrival of its gradient.
"""

from __future__ import annotations

from minidist.checks import is_count


def check_bound(bound) -> int | None:
    """None or an integer >= 0."""
    if bound is not None and not is_count(bound, 0):
        raise ValueError(f"the staleness bound must be None (no bound) or an integer >= 0, got {bound!r}")
    return None if bound is None else int(bound)


def may_start(worker: int, pushes: list[int], bound: int | None) -> bool:
    """True if ``worker`` may start its next step: it is at most ``bound`` steps ahead of the slowest.

    pushes: how many gradients each worker has pushed so far; bound: s >= 0, or None for no bound.
    """
    # BEGIN SOLUTION stale_synchronous_bound
    # BEGIN PROMPT
    # Hint: with no bound every worker may go on; otherwise compare how far this worker is ahead of the
    # slowest one (the smallest count) with the bound.
    # END PROMPT
    if bound is None:
        return True
    return pushes[worker] - min(pushes) <= bound
    # END SOLUTION
