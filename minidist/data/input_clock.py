"""The input pipeline on a simulated clock: when does a training step wait for its data?

A step computes for C seconds; loading one batch (read, decode, collate) takes L seconds on one worker.
The loop is the Loader's (loader.py): batch i is loaded by worker i mod k, and each worker may hold q
requests ahead of the loop — batch i is requested when the loop takes batch i − k·q. Then

    q >= 1 (prefetch):   step time → max(C, L/k)     the k workers together deliver a batch every L/k
    q = 0  (on demand):  step time = C + L           the loop asks for a batch only when it needs it,
                                                     and stalls for L every step, whatever k is

(k = 0, loading in the loop itself, is the q = 0 case.) A first batch always costs L before the first
step: the pipeline has to fill. The "Scaling Up Training" slides' advice, "Feed Data Fast": enough
workers that L/k <= C, and a prefetch queue so that loading overlaps computing.

``simulate_input_pipeline`` plays the loop event by event (no formula inside) so that the two lines
above can be checked against it; cost O(steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minidist.nn.checks import check_count, check_real


@dataclass(frozen=True)
class InputTimeline:
    """Per batch i (arrays of shape (steps,), simulated seconds): when its load was requested, started
    and finished, which worker loaded it (-1: the loop itself), and when step i started and ended."""

    requested: np.ndarray
    load_start: np.ndarray
    ready: np.ndarray
    worker: np.ndarray
    step_start: np.ndarray
    step_end: np.ndarray

    @property
    def stall(self) -> np.ndarray:
        """Seconds each step waited for its batch after the previous step ended (shape (steps,))."""
        previous_end = np.concatenate([[0.0], self.step_end[:-1]])
        return self.step_start - previous_end

    def steady_step_time(self, last: int) -> float:
        """Mean step time over the last ``last`` steps (past the pipeline's start-up), 1 <= last < steps."""
        if not 1 <= check_count(last, "steady_step_time last") < len(self.step_end):
            raise ValueError(f"steady_step_time needs 1 <= last <= steps - 1 = {len(self.step_end) - 1} "
                             f"(it measures from the end of the step before those), got {last}")
        return float((self.step_end[-1] - self.step_end[-1 - last]) / last)


def simulate_input_pipeline(steps: int, compute: float, load: float, workers: int,
                            prefetch: int) -> InputTimeline:
    """Play ``steps`` training steps of ``compute`` seconds fed by ``workers`` loaders (k) holding up to
    ``prefetch`` requests each (q), a batch taking ``load`` seconds. Returns the InputTimeline."""
    steps = check_count(steps, "steps")
    compute, load = check_real(compute, "compute", 0.0), check_real(load, "load", 0.0)
    k, q = check_count(workers, "workers", 0), check_count(prefetch, "prefetch", 0)
    on_demand = k == 0 or q == 0
    lanes = max(k, 1)
    free = np.zeros(lanes)                     # when each worker can start its next load
    t = {name: np.zeros(steps) for name in ("requested", "load_start", "ready", "step_start", "step_end")}
    worker = np.full(steps, -1 if k == 0 else 0, dtype=np.int64)
    for i in range(steps):
        previous_end = t["step_end"][i - 1] if i > 0 else 0.0
        if on_demand:                          # asked for when the loop needs it
            requested = previous_end
        else:                                  # asked for when the loop took batch i − k·q
            requested = t["step_start"][i - k * q] if i >= k * q else 0.0
        w = i % lanes
        worker[i] = w if k > 0 else -1
        start = max(requested, free[w])
        free[w] = start + load
        t["requested"][i], t["load_start"][i], t["ready"][i] = requested, start, start + load
        t["step_start"][i] = max(previous_end, start + load)       # wait for the batch if it is late
        t["step_end"][i] = t["step_start"][i] + compute
    return InputTimeline(worker=worker, **t)
