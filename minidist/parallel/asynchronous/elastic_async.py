"""Asynchronous elastic averaging SGD: each worker meets the center variable on its own, no barrier.

Zhang, Choromanska, LeCun, "Deep learning with elastic averaging SGD" (asynchronous EASGD, their
Algorithm 1; the "Scaling Deep Learning" slides: "Elastic Averaging SGD ... communicate periodically").
Rank 0 holds the center variable x̃; ranks 1..P are workers taking plain local SGD steps. As in
Algorithm 1, the elastic step and the gradient step of an exchange step start from the same point x
(the worker's x_i before that step): with every τ-th local step, worker i keeps x, takes its step
x_i ← x − η ∇f_i(x), sends x to the center, which at once (with x and its current x̃)

    e = α (x − x̃);   x̃ ← x̃ + e;   replies e;   the worker sets x_i ← x_i − e

so x_i ends at x − η ∇f_i(x) − α (x − x̃), Algorithm 1's lines a), b) and its gradient step. Exchanges
come with local steps τ−1, 2τ−1, … counting from 0 (Algorithm 1's "τ divides t" counts from t = 0,
where the pull is zero: x_i = x̃).

and the worker goes on; the others never wait for it. The center serves workers in order of arrival on
the simulated clock (ties: lower worker first), which ``easgd_schedule`` computes from the straggler
table and the link model with the ledger's arithmetic — so the center knows whom to receive from next.
Unlike synchronous EASGD (elastic.py), a straggler slows only its own exchanges.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np

from minidist.checks import check_count
from minidist.cluster import LinkModel
from minidist.nn.flat import flatten, unflatten

from .local_sgd import local_step
from .schedule import recv_on_schedule
from .stragglers import check_seconds


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
        x, y = batch(comm.rank - 1, step)
        exchange = (step + 1) % every == 0
        before = flatten([p.data for p in params]) if exchange else None   # Algorithm 1's x
        losses.append((comm.clock, local_step(comm, model, optimizer, loss_fn, x, y, duration)))
        if exchange:
            comm.send(before, 0)
            comm.recv(0, out=elastic)
            unflatten(flatten([p.data for p in params]) - elastic, [p.data for p in params])
    return {"losses": losses, "params": flatten([p.data for p in params]), "clock": comm.clock}
