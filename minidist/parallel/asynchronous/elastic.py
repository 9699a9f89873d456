"""Elastic averaging SGD: workers explore on their own, tied to a center variable by an elastic force.

Zhang, Choromanska, LeCun, "Deep learning with elastic averaging SGD" (the "Scaling Deep Learning"
slides: "Elastic Averaging SGD [Zhang, NIPS 2015]: communicate periodically"). Every τ steps, with the
moving rate α and β = P·α (synchronous EASGD, equations (5)-(6) of the paper):

    x_r ← x_r − α (x_r − x̃)                       each worker is pulled towards the center
    x̃  ← x̃ + α Σ_r (x_r − x̃) = (1 − β) x̃ + β · mean_r x_r     the center moves towards the workers

(both with the old x_r and x̃), and between exchanges each worker takes plain local SGD steps. Every rank
keeps its copy of x̃; the sum Σ_r x_r is one allreduce, so the copies stay bitwise equal. β = 1 and τ = 1
would reset every worker to the average: the elastic force (α < 1/P) lets them keep exploring.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import ALGORITHMS, allreduce

from .local_sgd import check_common, local_step


def train_elastic(comm, model, optimizer, loss_fn, batch, *, seconds, every: int, alpha: float,
                  algorithm: str = "ring") -> dict:
    """Run on every rank; returns {"losses": [(clock, loss)], "centers": [(clock, center x̃)]}.

    batch(rank, step) -> (x, y); seconds: (P, K) compute seconds; every: τ >= 1; alpha: 0 < α, P·α <= 1.
    """
    seconds = check_common(comm, seconds, every, "train_elastic")
    if not (alpha > 0 and comm.world_size * alpha <= 1):
        raise ValueError(f"train_elastic: the moving rate needs 0 < alpha and beta = P·alpha <= 1, got alpha={alpha} "
                         f"with P = {comm.world_size}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {algorithm!r}")
    params, steps = model.parameters(), seconds.shape[1]
    center = np.concatenate([p.data.ravel() for p in params])      # x̃ starts at the common initial model
    losses, centers = [], [(comm.clock, center.copy())]
    for step in range(steps):
        x, y = batch(comm.rank, step)
        losses.append((comm.clock, local_step(comm, model, optimizer, loss_fn, x, y, seconds[comm.rank, step])))
        if (step + 1) % every == 0:
            local = np.concatenate([p.data.ravel() for p in params])
            total = allreduce(comm, local, algorithm=algorithm)
            local -= alpha * (local - center)
            center = center + alpha * (total - comm.world_size * center)
            offset = 0
            for p in params:
                p.data[...] = local[offset:offset + p.size].reshape(p.shape)
                offset += p.size
            centers.append((comm.clock, center.copy()))
    return {"losses": losses, "centers": centers}
