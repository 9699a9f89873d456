"""The simulated clock of asynchronous SGD: stragglers' step times, and when each push reaches each server.

Synchronous SGD waits at every step for the slowest worker; asynchronous SGD does not (the "Scaling
Deep Learning" slides: "let model replicas learn in a decoupled fashion"). Worker w spends

    seconds[w, k] = base · slowdown[w] · (1 + jitter · E[w, k]),   E ~ Exponential(1) from ``rng``

simulated seconds computing its step k (a trainer charges them where it would compute; the arithmetic
is real). The stale-synchronous bound (Ho et al.'s stale synchronous parallel model; the "Hardware
Accelerators for Training DNNs" slides: "Asynchronous SGD ... staleness of updates"): worker w, having
pushed pushes[w] gradients, may start its next step when

    pushes[w] − min_v pushes[v] <= s

s = 0 is synchronous SGD (nobody starts step k + 1 before everybody finished step k); s = None means no
bound at all (fully asynchronous). The staleness of an update is how many updates the server applied
between the worker's pull and the arrival of its gradient.

The cluster's receive names its sender, so a server must know in advance from which worker the next
gradient comes. That order follows from the clock alone:

    worker w, step k:  compute seconds[w, k]; push shard j to server j (α + n_j β each, in order j = 0..S−1);
                       wait for the reply of every server, then start step k + 1
    server j:          takes pushes in order of arrival (ties: lower worker first), applies each at once,
                       then replies (α + n_j β) to every waiting worker the stale-synchronous bound lets go

``ps_schedule`` replays exactly these rules with the cluster ledger's arithmetic (clock + α + n·β for a
send, max(clock, arrival) for a receive), so the trainer's clocks equal it bit for bit. Sources: Dean et
al., "Large Scale Distributed Deep Networks" (Downpour SGD); the "Scaling Deep Learning" slides.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np

from minidist.nn.checks import check_count, check_real


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
    check_real(base, "step_seconds: base (seconds)", 0, strict=True)
    factor = np.ones(workers) if slowdown is None else np.asarray(slowdown, dtype=np.float64)
    if factor.shape != (workers,) or not np.all(factor > 0):
        raise ValueError(f"step_seconds: slowdown must hold {workers} factors > 0, got {slowdown}")
    check_real(jitter, "step_seconds: jitter", 0)
    table = base * np.repeat(factor[:, None], steps, axis=1)
    if jitter > 0:
        if not isinstance(rng, np.random.Generator):
            raise ValueError("step_seconds: jitter > 0 needs an explicit rng (numpy Generator)")
        table *= 1 + jitter * rng.exponential(size=(workers, steps))
    return table


def check_bound(bound) -> int | None:
    """None (no bound) or an integer >= 0."""
    return None if bound is None else check_count(bound, "the staleness bound", 0)


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


class Push(NamedTuple):
    """One gradient shard as server j takes it: who sent it, when, how stale, and whom j replies to next."""

    worker: int
    step: int
    received: float        # the server's clock once the push is in (max(its clock, arrival))
    staleness: int         # updates applied by this server since the worker pulled
    replies: tuple         # workers this server sends fresh parameters to right after this update


class PSSchedule(NamedTuple):
    pushes: list           # per server: its Pushes in the order it applies them
    worker_clock: np.ndarray   # each worker's clock after its last push, shape (W,)


def recv_on_schedule(comm, src: int, out: np.ndarray, expected: float, trainer: str) -> None:
    """A server's receive from ``src`` into ``out``, which must end at the clock its schedule computed
    (else the run's link differs from the one the schedule was computed with: a RuntimeError)."""
    comm.recv(src, out=out)
    if comm.clock != expected:
        raise RuntimeError(f"rank {comm.rank}: the clock ({comm.clock}) left the schedule ({expected}); "
                           f"pass {trainer} the LinkModel the run uses")


def ps_schedule(seconds: np.ndarray, push_bytes: list[int], pull_bytes: list[int], alpha: float, beta: float,
                bound: int | None = None) -> PSSchedule:
    """Simulate asynchronous SGD on S = len(push_bytes) servers and W workers for K steps each.

    seconds: (W, K) compute seconds per worker and step; push_bytes / pull_bytes: bytes of one push /
    one reply of each server; alpha, beta: the link model; bound: the staleness bound s (None: none).
    """
    seconds = check_seconds(seconds, "ps_schedule")
    if len(push_bytes) != len(pull_bytes) or not push_bytes:
        raise ValueError("ps_schedule: push_bytes and pull_bytes need one entry per server (at least one)")
    bound = check_bound(bound)
    workers, steps = seconds.shape
    servers = len(push_bytes)
    clock = [0.0] * workers
    next_step = [0] * workers
    pushed = [[0] * workers for _ in range(servers)]
    pulled = [[0] * workers for _ in range(servers)]        # the version each worker last received
    version, server_clock = [0] * servers, [0.0] * servers
    waiting = [set() for _ in range(servers)]
    reply_at: list[dict] = [{} for _ in range(workers)]     # server -> arrival of its reply
    heap, pushes = [], [[] for _ in range(servers)]

    def start(w: int) -> None:                              # compute step next_step[w], push every shard
        t = clock[w] + float(seconds[w, next_step[w]])
        for j in range(servers):
            t = t + alpha + push_bytes[j] * beta            # the ledger's send: (start + α) + n·β
            heapq.heappush(heap, (t, j, w, next_step[w]))
        clock[w] = t
        next_step[w] += 1

    for w in range(workers):
        start(w)
    while heap:
        arrival, j, w, k = heapq.heappop(heap)
        server_clock[j] = max(server_clock[j], arrival)
        received, staleness = server_clock[j], version[j] - pulled[j][w]
        version[j] += 1
        pushed[j][w] = k + 1
        if k + 1 < steps:
            waiting[j].add(w)
        replies = []
        for v in sorted(waiting[j]):
            if may_start(v, pushed[j], bound):
                server_clock[j] = server_clock[j] + alpha + pull_bytes[j] * beta
                reply_at[v][j], pulled[j][v] = server_clock[j], version[j]
                waiting[j].discard(v)
                replies.append(v)
                if len(reply_at[v]) == servers:             # the worker receives from servers 0..S−1
                    for i in range(servers):
                        clock[v] = max(clock[v], reply_at[v][i])
                    reply_at[v] = {}
                    start(v)
        pushes[j].append(Push(w, k, received, staleness, tuple(replies)))
    return PSSchedule(pushes, np.array(clock))
