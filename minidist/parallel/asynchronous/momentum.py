"""Asynchrony begets momentum: a stale parameter server behaves like SGD with extra momentum.

Mitliagkas, Zhang, Hadjis, Ré, "Asynchrony begets Momentum, with an Application to Deep Learning" (the
"Hardware Accelerators for Training DNNs" slides: "Asynchrony Begets Momentum ... pick momentum that
minimizes number of iterations to same loss"). With P workers whose step times are exponential (a
queue), every update comes from a uniformly random worker, so the staleness S of an update is geometric,
P(S = l) = (1/P)(1 − 1/P)^l, and in expectation

    E[w_{t+1} − w_t] = (1 − 1/P) · E[w_t − w_{t−1}] − (1/P) · lr · E[∇f(w_t)]

— heavy-ball momentum μ_implicit = 1 − 1/P. Explicit momentum adds to it, so the best *explicit* μ
falls as workers are added (roughly μ*_P ≈ μ*_1 − μ_implicit, and below zero under heavy asynchrony).

``sweep_momentum`` runs ``replay_parameter_server`` (parameter_server.py) for every (P, μ) pair.
"""

from __future__ import annotations

import numpy as np

from minidist.nn.checks import check_count, check_real, is_count

from .parameter_server import replay_parameter_server
from .schedule import check_seconds


def implicit_momentum(workers: int) -> float:
    """The queueing model's implicit momentum 1 − 1/P for P >= 1 asynchronous workers."""
    return 1.0 - 1.0 / check_count(workers, "implicit_momentum: workers")


def least_squares(samples: int, features: int, condition: float, rng: np.random.Generator):
    """A least-squares problem with curvature spread ``condition``: x (samples, features), y (samples, 1).

    x = U diag(s) Vᵀ with orthonormal U, V and s from √samples down to √samples/√condition, so the
    MSE Hessian (2/samples) xᵀx has eigenvalues from 2 down to 2/condition; y = x w* exactly (minimum 0).
    """
    if not (is_count(samples) and is_count(features) and features <= samples):
        raise ValueError(f"least_squares: needs integers 1 <= features <= samples, got {features}, {samples}")
    check_real(condition, "least_squares: condition", 1)
    if not isinstance(rng, np.random.Generator):
        raise TypeError("least_squares: rng must be a numpy Generator")
    u, _ = np.linalg.qr(rng.standard_normal((samples, features)))
    v, _ = np.linalg.qr(rng.standard_normal((features, features)))
    s = np.sqrt(samples) * np.geomspace(1.0, 1.0 / np.sqrt(condition), features)
    x = (u * s) @ v.T
    return x, x @ rng.standard_normal((features, 1))


def sweep_momentum(make_model, loss_fn, batch, evaluate, *, lr: float, momenta, seconds_for,
                   workers) -> np.ndarray:
    """The loss after the budget for every (P, μ): a (len(workers), len(momenta)) array (inf if it diverged).

    make_model() -> the same initial model every call; evaluate(flat parameters) -> the loss to compare;
    seconds_for(P) -> the (P, K) step-time table for P workers (choose K so every P gets the same number
    of updates P·K); momenta: explicit μ values in [0, 1); workers: the P values.
    """
    momenta, workers = [float(m) for m in momenta], list(workers)
    if not momenta or not workers:
        raise ValueError("sweep_momentum: momenta and workers must not be empty")
    losses = np.empty((len(workers), len(momenta)))
    for i, p in enumerate(workers):
        table = check_seconds(seconds_for(p), f"sweep_momentum: seconds_for({p})", workers=p)
        for j, mu in enumerate(momenta):
            with np.errstate(over="ignore", invalid="ignore"):
                out = replay_parameter_server(make_model(), loss_fn, batch, lr=lr, seconds=table, momentum=mu)
                loss = float(evaluate(out["params"]))
            losses[i, j] = loss if np.isfinite(loss) else np.inf
    return losses


def best_momentum(losses: np.ndarray, momenta) -> np.ndarray:
    """The μ of the smallest loss in each row of ``losses`` (ties: the smaller μ), shape (rows,)."""
    losses, momenta = np.asarray(losses, dtype=np.float64), np.asarray(momenta, dtype=np.float64)
    if losses.ndim != 2 or losses.shape[1] != momenta.size:
        raise ValueError(f"best_momentum: losses must have shape (rows, {momenta.size}), got {losses.shape}")
    return momenta[np.argmin(losses, axis=1)]
