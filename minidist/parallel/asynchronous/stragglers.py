"""Stragglers on the simulated clock: how long each worker's step takes, as a table.

Synchronous SGD waits at every step for the slowest worker; asynchronous SGD does not (the "Scaling
Deep Learning" slides: "let model replicas learn in a decoupled fashion"). The table says how many
simulated seconds worker w spends computing its step k:

    seconds[w, k] = base · slowdown[w] · (1 + jitter · E[w, k]),   E ~ Exponential(1) from ``rng``

A trainer charges seconds[w, k] with ``comm.elapse`` where it would compute; the arithmetic is real.
"""

from __future__ import annotations

import numpy as np

from minidist.checks import check_count


def check_seconds(seconds, where: str, workers: int | None = None) -> np.ndarray:
    """seconds as a float64 (workers, steps) table of times >= 0 with steps >= 1 (and ``workers`` rows when
    given), else a ValueError naming ``where``: the check of every trainer and schedule that reads one."""
    table = np.asarray(seconds, dtype=np.float64)
    rows = "workers" if workers is None else f"workers = {workers}"
    if table.ndim != 2 or table.size == 0 or not np.all(table >= 0) or workers not in (None, len(table)):
        raise ValueError(f"{where}: seconds must have shape ({rows}, steps), times >= 0, got shape "
                         f"{table.shape}")
    return table


def step_seconds(workers: int, steps: int, base: float, slowdown=None, jitter: float = 0.0,
                 rng: np.random.Generator | None = None) -> np.ndarray:
    """The (workers, steps) table of compute seconds per step.

    slowdown: one factor >= 1 ... per worker (e.g. [1, 1, 1, 3]: the last worker 3x slower), None = all 1.
    jitter: the mean extra fraction of a random slowdown per step (needs ``rng`` when > 0).
    """
    workers, steps = check_count(workers, "step_seconds: workers"), check_count(steps, "step_seconds: steps")
    if not base > 0:
        raise ValueError(f"step_seconds: base must be > 0 seconds, got {base}")
    factor = np.ones(workers) if slowdown is None else np.asarray(slowdown, dtype=np.float64)
    if factor.shape != (workers,) or not np.all(factor > 0):
        raise ValueError(f"step_seconds: slowdown must hold {workers} factors > 0, got {slowdown}")
    if not jitter >= 0:
        raise ValueError(f"step_seconds: jitter must be >= 0, got {jitter}")
    table = base * np.repeat(factor[:, None], steps, axis=1)
    if jitter > 0:
        if not isinstance(rng, np.random.Generator):
            raise ValueError("step_seconds: jitter > 0 needs an explicit rng (numpy Generator)")
        table *= 1 + jitter * rng.exponential(size=(workers, steps))
    return table
