"""Communicate periodically: local SGD and elastic averaging SGD (the "Scaling Deep Learning" slides).

Local SGD (periodic model averaging; Mitliagkas et al. and others study how far workers can drift):
each of the P workers runs its own optimizer on its own batches,

    w_r ← w_r − lr · ∇ℓ_r(w_r)              every step, no communication
    w_r ← (1/P) Σ_q w_q                      every H steps (an allreduce of the parameters)

H = 1 with plain SGD is synchronous data parallelism: (1/P) Σ_r (w − lr g_r) = w − lr · (1/P) Σ_r g_r.
Larger H sends 1/H of the bytes and waits for stragglers only at the averaging steps.

Elastic averaging SGD (Zhang, Choromanska, LeCun, "Deep learning with elastic averaging SGD"): the
workers explore on their own, tied to a center variable x̃ by an elastic force. With the moving rate
α = ηρ, the gradient step and the elastic step of an exchange both start from the same point x_r (and x̃):

    x_r ← x_r − η ∇f_r(x_r) − α (x_r − x̃)       each worker steps and is pulled to the center
    x̃  ← x̃ + α Σ_r (x_r − x̃)                    the center moves to the workers

(with another optimizer, "− η ∇f" is its update at x_r). Between exchanges each worker takes plain
local SGD steps. Exchanges come with every τ-th local step (steps τ−1, 2τ−1, … counting from 0; the
paper's "τ divides t" counts from t = 0, where the pull is zero since every x_r = x̃).
β = P·α = 1 and τ = 1 would reset every worker to the average: the elastic force (α < 1/P) lets them explore.

``train_elastic`` is synchronous EASGD (equations (5)-(6) of the paper): every rank keeps its copy of
x̃, and Σ_r x_r is one allreduce, so the copies stay bitwise equal. ``train_elastic_async`` is their
Algorithm 1: rank 0 holds x̃, ranks 1..P are workers, and each meets the center on its own, no barrier,
in the order of arrival on the simulated clock (ties: lower worker first) that ``easgd_schedule``
computes with the ledger's arithmetic, so the center knows whom to receive from next. A straggler slows
only its own exchanges.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np

from minidist.cluster import LinkModel
from minidist.collectives import ALGORITHMS, allreduce
from minidist.nn.checks import check_count
from minidist.nn.flat import flatten, unflatten
from minidist.sim.compute import charge_seconds

from .schedule import check_seconds, recv_on_schedule


def check_common(comm, seconds, every: int, algorithm: str, what: str) -> np.ndarray:
    """The checks local SGD and EASGD share: the period, the allreduce algorithm, one row of step times per
    rank (returned as a float64 table)."""
    check_count(every, f"{what}: the averaging period")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {algorithm!r}")
    return check_seconds(seconds, what, workers=comm.world_size)


def local_step(comm, model, optimizer, loss_fn, batch, duration: float, losses: list) -> None:
    """One optimizer step on this worker's own batch (x, y), charged ``duration`` seconds; appends
    (the clock the step started at, its loss) to ``losses``."""
    (x, y), started = batch, comm.clock
    optimizer.zero_grad()
    loss = loss_fn.forward(model.forward(x), y)
    model.backward(loss_fn.backward())
    optimizer.step()
    charge_seconds(comm, float(duration), "local step")
    losses.append((started, float(loss)))


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
        local_step(comm, model, optimizer, loss_fn, batch(comm.rank, step), seconds[comm.rank, step], losses)
        if (step + 1) % every == 0 or step + 1 == steps:
            flat = allreduce(comm, flatten([p.data for p in params]), algorithm=algorithm) / comm.world_size
            unflatten(flat, [p.data for p in params])
            averages.append((comm.clock, flat))
    return {"losses": losses, "averages": averages}


def train_elastic(comm, model, optimizer, loss_fn, batch, *, seconds, every: int, alpha: float,
                  algorithm: str = "ring") -> dict:
    """Run on every rank; returns {"losses": [(clock, loss)], "centers": [(clock, center x̃)]}.

    batch(rank, step) -> (x, y); seconds: (P, K) compute seconds; every: τ >= 1; alpha: 0 < α, P·α <= 1.
    """
    seconds = check_common(comm, seconds, every, algorithm, "train_elastic")
    if not (alpha > 0 and comm.world_size * alpha <= 1):
        raise ValueError(f"train_elastic: the moving rate needs 0 < alpha and beta = P·alpha <= 1, got "
                         f"alpha={alpha} with P = {comm.world_size}")
    params, steps = model.parameters(), seconds.shape[1]
    center = flatten([p.data for p in params])      # x̃ starts at the common initial model
    losses, centers = [], [(comm.clock, center.copy())]
    for step in range(steps):
        exchange = (step + 1) % every == 0
        before = flatten([p.data for p in params]) if exchange else None  # x_r,t
        local_step(comm, model, optimizer, loss_fn, batch(comm.rank, step), seconds[comm.rank, step], losses)
        if exchange:
            total = allreduce(comm, before, algorithm=algorithm)
            local = flatten([p.data for p in params]) - alpha * (before - center)
            center = center + alpha * (total - comm.world_size * center)
            unflatten(local, [p.data for p in params])
            centers.append((comm.clock, center.copy()))
    return {"losses": losses, "centers": centers}


class Exchange(NamedTuple):
    """One meeting of a worker with the center, in the order the center serves them."""

    worker: int
    step: int            # the worker's local step k after which it exchanges ((k + 1) % τ == 0)
    received: float      # the center's clock once the worker's x_i is in
    replied: float       # when the reply e reaches the worker


TAU = "asynchronous EASGD: the communication period tau"


def easgd_schedule(seconds: np.ndarray, every: int, nbytes: int, alpha: float, beta: float) -> list[Exchange]:
    """The exchanges of asynchronous EASGD in the center's order.

    seconds: (P, K) compute seconds per worker and local step; every: τ; nbytes: bytes of x_i (and of the
    reply e); alpha, beta: the link model (a message costs α + nβ).
    """
    seconds, every = check_seconds(seconds, "easgd_schedule"), check_count(every, TAU)
    workers, steps = seconds.shape
    clock, next_step, heap = [0.0] * workers, [0] * workers, []

    def advance(w: int) -> None:               # local steps up to the next exchange (or the end)
        while next_step[w] < steps:
            k = next_step[w]
            clock[w] = clock[w] + float(seconds[w, k])
            next_step[w] += 1
            if (k + 1) % every == 0:
                clock[w] = clock[w] + alpha + nbytes * beta          # the ledger's send
                heapq.heappush(heap, (clock[w], w, k))
                return

    for w in range(workers):
        advance(w)
    center, exchanges = 0.0, []
    while heap:
        arrival, w, k = heapq.heappop(heap)
        center = max(center, arrival)
        received = center
        center = center + alpha + nbytes * beta                     # the reply e
        clock[w] = max(clock[w], center)
        exchanges.append(Exchange(w, k, received, center))
        advance(w)
    return exchanges


def train_elastic_async(comm, model, optimizer, loss_fn, batch, *, seconds, every: int, alpha: float,
                        link: LinkModel | None = None) -> dict:
    """Run on every rank of ``run(train_elastic_async, 1 + P, ...)``; returns this rank's record.

    model: the same initial replica on every rank (x̃ starts there); optimizer: each worker's own (the
    center ignores it); batch(worker, step) -> (x, y) with worker in 0..P−1; seconds: (P, K) compute
    seconds; every: τ >= 1; alpha: the moving rate, 0 < α < 1; link: the run's LinkModel.
    The center returns {"center": x̃, shape (n,), "history": [(clock, x̃ copy)] after every exchange,
    "exchanges": [(worker, step)]}; worker i returns {"losses": [(clock, loss)], "params": x_i, "clock"}.
    """
    if comm.world_size < 2:
        raise ValueError(f"asynchronous EASGD needs a center rank and at least one worker: world size >= 2, "
                         f"got {comm.world_size}")
    every = check_count(every, TAU)
    if not 0 < alpha < 1:
        raise ValueError(f"asynchronous EASGD: the moving rate alpha must be in (0, 1), got {alpha}")
    seconds = check_seconds(seconds, "asynchronous EASGD", workers=comm.world_size - 1)
    link = LinkModel() if link is None else link
    params = model.parameters()
    flat = flatten([p.data for p in params])
    if comm.rank == 0:
        plan = easgd_schedule(seconds, every, flat.nbytes, link.alpha, link.beta)
        return _center(comm, flat, plan, alpha)
    return _worker(comm, model, optimizer, loss_fn, batch, params, seconds[comm.rank - 1], every)


def _center(comm, center: np.ndarray, plan: list[Exchange], alpha: float) -> dict:
    """Serve the exchanges in the schedule's order: e = α(x_i − x̃), x̃ ← x̃ + e, reply e."""
    incoming = np.empty_like(center)
    history, exchanges = [(comm.clock, center.copy())], []
    for ex in plan:
        recv_on_schedule(comm, 1 + ex.worker, incoming, ex.received, "train_elastic_async")
        elastic = alpha * (incoming - center)
        center += elastic
        comm.send(elastic, 1 + ex.worker)
        history.append((comm.clock, center.copy()))
        exchanges.append((ex.worker, ex.step))
    return {"center": center, "history": history, "exchanges": exchanges}


def _worker(comm, model, optimizer, loss_fn, batch, params, seconds, every) -> dict:
    """Local SGD steps; with every τ-th, send the x_i it started from, receive e, x_i ← x_i − e."""
    elastic = np.empty(sum(p.size for p in params), dtype=params[0].data.dtype)
    losses = []
    for step, duration in enumerate(seconds):
        exchange = (step + 1) % every == 0
        before = flatten([p.data for p in params]) if exchange else None   # Algorithm 1's x
        local_step(comm, model, optimizer, loss_fn, batch(comm.rank - 1, step), duration, losses)
        if exchange:
            comm.send(before, 0)
            comm.recv(0, out=elastic)
            unflatten(flatten([p.data for p in params]) - elastic, [p.data for p in params])
    return {"losses": losses, "params": flatten([p.data for p in params]), "clock": comm.clock}
