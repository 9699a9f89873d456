"""Local SGD (periodic model averaging): every worker steps on its own, the models are averaged every H steps.

Mitliagkas et al. and others study how far workers can drift; the "Scaling Deep Learning" slides list the
family under "communicate periodically". Each of the P workers runs its own optimizer on its own batches:

    w_r ← w_r − lr · ∇ℓ_r(w_r)              every step, no communication
    w_r ← (1/P) Σ_q w_q                      every H steps (an allreduce of the parameters)

H = 1 with plain SGD is synchronous data parallelism: (1/P) Σ_r (w − lr g_r) = w − lr · (1/P) Σ_r g_r.
Larger H sends 1/H of the bytes and waits for stragglers only at the averaging steps.
"""

from __future__ import annotations

import numpy as np

from minidist.checks import check_count
from minidist.collectives import ALGORITHMS, allreduce
from minidist.nn.flat import flatten, unflatten
from minidist.sim.compute import charge_seconds

from .schedule import check_seconds


def check_common(comm, seconds, every: int, algorithm: str, what: str) -> np.ndarray:
    """The checks local SGD and EASGD share: the period, the allreduce algorithm, one row of step times per
    rank (returned as a float64 table)."""
    check_count(every, f"{what}: the averaging period")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {algorithm!r}")
    return check_seconds(seconds, what, workers=comm.world_size)


def local_step(comm, model, optimizer, loss_fn, x, y, duration: float) -> float:
    """One optimizer step on this worker's own batch, charged ``duration`` seconds; returns the loss."""
    optimizer.zero_grad()
    loss = loss_fn.forward(model.forward(x), y)
    model.backward(loss_fn.backward())
    optimizer.step()
    charge_seconds(comm, float(duration), "local step")
    return float(loss)


def train_local_sgd(comm, model, optimizer, loss_fn, batch, *, seconds, every: int,
                    algorithm: str = "ring") -> dict:
    """Run on every rank; returns {"losses": [(clock, loss)], "averages": [(clock, flat parameters)]}.

    batch(rank, step) -> (x, y); seconds: (P, K) compute seconds (fixes K steps); every: H >= 1.
    The last step always averages, so every rank ends with the same model.
    """
    seconds = check_common(comm, seconds, every, algorithm, "train_local_sgd")
    params, steps = model.parameters(), seconds.shape[1]
    losses, averages = [], []
    for step in range(steps):
        x, y = batch(comm.rank, step)
        duration = seconds[comm.rank, step]
        losses.append((comm.clock, local_step(comm, model, optimizer, loss_fn, x, y, duration)))
        if (step + 1) % every == 0 or step + 1 == steps:
            flat = allreduce(comm, flatten([p.data for p in params]), algorithm=algorithm) / comm.world_size
            unflatten(flat, [p.data for p in params])
            averages.append((comm.clock, flat))
    return {"losses": losses, "averages": averages}
