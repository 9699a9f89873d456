"""Elastic averaging SGD: workers explore on their own, tied to a center variable by an elastic force.

Zhang, Choromanska, LeCun, "Deep learning with elastic averaging SGD" (the "Scaling Deep Learning"
slides: "Elastic Averaging SGD [Zhang, NIPS 2015]: communicate periodically"). Synchronous EASGD,
equations (5)-(6) of the paper, with the moving rate α = ηρ and β = P·α: at an exchange step t the
gradient step and the elastic step are both taken from the same point x_r,t (and the same x̃_t),

    x_r,t+1 = x_r,t − η ∇f_r(x_r,t) − α (x_r,t − x̃_t)       each worker steps and is pulled to the center
    x̃_t+1  = x̃_t + α Σ_r (x_r,t − x̃_t) = (1 − β) x̃_t + β · mean_r x_r,t   the center moves to the workers

(with another optimizer, "− η ∇f" is its update at x_r,t). Between exchanges each worker takes plain
local SGD steps. Exchanges come with every τ-th local step (steps τ−1, 2τ−1, … counting from 0; the
paper's periodic form, "τ divides t", counts from t = 0, where the pull is zero since every x_r = x̃).
Every rank keeps its copy of x̃; the sum Σ_r x_r,t is one allreduce, so the copies stay bitwise equal.
β = 1 and τ = 1 would reset every worker to the average: the elastic force (α < 1/P) lets them explore.
"""

from __future__ import annotations

from minidist.collectives import allreduce
from minidist.nn.flat import flatten, unflatten

from .local_sgd import check_common, local_step


def train_elastic(comm, model, optimizer, loss_fn, batch, *, seconds, every: int, alpha: float,
                  algorithm: str = "ring") -> dict:
    """Run on every rank; returns {"losses": [(clock, loss)], "centers": [(clock, center x̃)]}.

    batch(rank, step) -> (x, y); seconds: (P, K) compute seconds; every: τ >= 1; alpha: 0 < α, P·α <= 1.
    """
    seconds = check_common(comm, seconds, every, algorithm, "train_elastic")
    if not (alpha > 0 and comm.world_size * alpha <= 1):
        raise ValueError(
            f"train_elastic: the moving rate needs 0 < alpha and beta = P·alpha <= 1, got alpha={alpha} "
            f"with P = {comm.world_size}"
        )
    params, steps = model.parameters(), seconds.shape[1]
    center = flatten([p.data for p in params])      # x̃ starts at the common initial model
    losses, centers = [], [(comm.clock, center.copy())]
    for step in range(steps):
        x, y = batch(comm.rank, step)
        exchange = (step + 1) % every == 0
        before = flatten([p.data for p in params]) if exchange else None  # x_r,t
        losses.append(
            (comm.clock, local_step(comm, model, optimizer, loss_fn, x, y, seconds[comm.rank, step]))
        )
        if exchange:
            total = allreduce(comm, before, algorithm=algorithm)
            local = flatten([p.data for p in params]) - alpha * (before - center)
            center = center + alpha * (total - comm.world_size * center)
            unflatten(local, [p.data for p in params])
            centers.append((comm.clock, center.copy()))
    return {"losses": losses, "centers": centers}
