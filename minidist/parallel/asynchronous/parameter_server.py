"""Asynchronous SGD with parameter servers (Downpour SGD), stale-synchronous if asked.

Dean et al., "Large Scale Distributed Deep Networks" (the "Scaling Deep Learning" slides: "Parameter
Server [Dean, NIPS 2012]: asynchronously update parameters"; "Hardware Accelerators for Training DNNs":
"Distributed asynchronous SGD"). Ranks 0..S−1 are servers, each holding one piece of the flat
parameter vector (minidist.collectives.pieces's rule); ranks S..P−1 are workers. Per step a worker

    computes g = ∇ℓ(w_pulled) on its own batch,  pushes piece j of g to server j,  pulls fresh pieces

and server j applies every push on arrival with its optimizer (SGD, optionally with momentum:
M ← μM − lr·g; W ← W + M), without waiting for the other workers. With a staleness bound s, a worker
more than s steps ahead of the slowest waits for its reply; s = 0 is synchronous parameter-server SGD.
Pushes and replies follow the order ``ps_schedule`` computes (schedule.py).

``replay_parameter_server`` is the one-process version with one server: the same pushes in the same
order, each gradient taken at the parameters its worker last pulled — cheap enough for a sweep.
"""

from __future__ import annotations

import numpy as np

from minidist.cluster import LinkModel
from minidist.collectives.pieces import split_bounds
from minidist.nn import Parameter
from minidist.nn.checks import check_real, is_count
from minidist.nn.flat import flatten, unflatten
from minidist.optim import SGD
from minidist.sim.compute import charge_seconds

from .schedule import check_seconds, ps_schedule, recv_on_schedule


def train_parameter_server(comm, model, loss_fn, batch, *, lr: float, seconds: np.ndarray, servers: int = 1,
                           bound: int | None = None, momentum: float = 0.0, link: LinkModel | None = None,
                           record_every: int = 0) -> dict:
    """Run on every rank of ``run(train_parameter_server, S + W, model, ...)``; returns this rank's record.

    model: the same initial replica on every rank (build it from one seed); loss_fn: e.g. MSELoss();
    batch(worker, step) -> (x, y): worker's batch at that step; seconds: (W, K) compute seconds (the
    table also fixes the number of steps K); link: the run's LinkModel (default LinkModel()).
    Servers return {"shard", "staleness", "times" (clock of each update), "history": [(clock, shard copy)]
    every record_every updates}; workers return {"losses": [(clock, loss)], "clock"}.
    """
    if not is_count(servers) or servers >= comm.world_size:
        raise ValueError(f"servers must be an integer with 1 <= servers < world size = {comm.world_size} "
                         f"(at least one worker), got {servers!r}")
    check_real(lr, "train_parameter_server: lr", 0, strict=True)
    link = LinkModel() if link is None else link
    seconds = check_seconds(seconds, "train_parameter_server", workers=comm.world_size - servers)
    params = model.parameters()
    flat = flatten([p.data for p in params])
    pieces = split_bounds(flat.size, servers)
    if any(lo == hi for lo, hi in pieces):
        raise ValueError(f"{servers} servers for {flat.size} parameters: a server would hold nothing")
    nbytes = [(hi - lo) * flat.itemsize for lo, hi in pieces]
    plan = ps_schedule(seconds, nbytes, nbytes, link.alpha, link.beta, bound)
    if comm.rank < servers:
        return _serve(comm, flat, pieces[comm.rank], plan.pushes[comm.rank], servers, lr, momentum,
                      record_every)
    return _work(comm, model, loss_fn, batch, params, pieces, seconds[comm.rank - servers], servers)


def _serve(comm, flat, piece, pushes, servers, lr, momentum, record_every) -> dict:
    """Apply every push of this server's schedule in order; reply to the workers it lets go."""
    shard = Parameter(flat[piece[0]:piece[1]].copy())
    optimizer = SGD([shard], lr=lr, momentum=momentum)
    version, sent = 0, {}
    staleness, times, history = [], [], [(comm.clock, shard.data.copy())]
    for push in pushes:
        recv_on_schedule(comm, servers + push.worker, shard.grad, push.received, "train_parameter_server")
        staleness.append(version - sent.get(push.worker, 0))
        times.append(comm.clock)
        optimizer.step()
        version += 1
        for worker in push.replies:
            comm.send(shard.data, servers + worker)
            sent[worker] = version
        if record_every and version % record_every == 0:
            history.append((comm.clock, shard.data.copy()))
    return {"shard": shard.data, "staleness": staleness, "times": times, "history": history}


def _work(comm, model, loss_fn, batch, params, pieces, seconds, servers) -> dict:
    """Compute, push, pull, for every step of this worker's row of the straggler table."""
    flat_grad = np.empty(sum(p.size for p in params), dtype=params[0].data.dtype)
    flat_data = np.empty_like(flat_grad)
    losses = []
    for step, duration in enumerate(seconds):
        x, y = batch(comm.rank - servers, step)
        model.zero_grad()
        loss = loss_fn.forward(model.forward(x), y)
        model.backward(loss_fn.backward())
        charge_seconds(comm, float(duration), f"step {step}")
        losses.append((comm.clock, float(loss)))
        flatten([p.grad for p in params], out=flat_grad)
        for j, (lo, hi) in enumerate(pieces):
            comm.send(flat_grad[lo:hi], j)
        if step + 1 < len(seconds):
            for j, (lo, hi) in enumerate(pieces):
                comm.recv(j, out=flat_data[lo:hi])
            unflatten(flat_data, [p.data for p in params])
    return {"losses": losses, "clock": comm.clock}


def replay_parameter_server(model, loss_fn, batch, *, lr: float, seconds: np.ndarray, momentum: float = 0.0,
                            bound: int | None = None, link: LinkModel | None = None,
                            record_every: int = 0) -> dict:
    """Asynchronous SGD with one parameter server, replayed in this process in the schedule's order.

    model, loss_fn, batch, lr, seconds (W, K), momentum, bound, link: as for train_parameter_server.
    Returns {"params": flat parameters, shape (n,), "staleness": one int per update, "times": the
    server's clock at each update, "history": [(clock, flat copy)] every record_every updates}.
    ``model``'s parameters are overwritten (they end at the last pulled copy).
    """
    check_real(lr, "replay_parameter_server: lr", 0, strict=True)
    link = LinkModel() if link is None else link
    seconds = np.asarray(seconds, dtype=np.float64)
    params = model.parameters()
    shard = Parameter(flatten([p.data for p in params]))
    optimizer = SGD([shard], lr=lr, momentum=momentum)
    nbytes = shard.data.nbytes
    plan = ps_schedule(seconds, [nbytes], [nbytes], link.alpha, link.beta, bound)
    pulled = [shard.data.copy() for _ in range(seconds.shape[0])]      # what each worker computes on
    version, sent = 0, [0] * seconds.shape[0]
    staleness, times, history = [], [], [(0.0, shard.data.copy())]
    for push in plan.pushes[0]:
        unflatten(pulled[push.worker], [p.data for p in params])
        x, y = batch(push.worker, push.step)
        model.zero_grad()
        loss_fn.forward(model.forward(x), y)
        model.backward(loss_fn.backward())
        flatten([p.grad for p in params], out=shard.grad)
        staleness.append(version - sent[push.worker])
        times.append(push.received)
        optimizer.step()
        version += 1
        for worker in push.replies:
            pulled[worker], sent[worker] = shard.data.copy(), version
        if record_every and version % record_every == 0:
            clock = push.received           # the server's clock after its replies, as the ledger adds it
            for _ in push.replies:
                clock = clock + link.alpha + nbytes * link.beta
            history.append((clock, shard.data.copy()))
    return {"params": shard.data, "staleness": staleness, "times": times, "history": history}
