"""Asynchronous EASGD: against the formulas in one process, and against a replay of the schedule's
exchanges."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.cluster import ClusterError, LinkModel, run
from minidist.nn import MSELoss
from minidist.optim import SGD
from minidist.parallel.asynchronous import easgd_schedule, step_seconds, train_elastic_async
from tests.parallel.async_helpers import batch, model

LR, ALPHA = 0.1, 0.3


def flat(net):
    return np.concatenate([p.data.ravel() for p in net.parameters()])


def load(net, vector):
    offset = 0
    for p in net.parameters():
        p.data[...] = vector[offset:offset + p.size].reshape(p.shape)
        offset += p.size


def sgd_step(net, optimizer, worker, step):
    loss_fn = MSELoss()
    optimizer.zero_grad()
    loss_fn.forward(net.forward(batch(worker, step)[0]), batch(worker, step)[1])
    net.backward(loss_fn.backward())
    optimizer.step()


def easgd(comm, seconds, every, alpha):
    net = model()
    return train_elastic_async(comm, net, SGD(net.parameters(), lr=LR, momentum=0.5), MSELoss(), batch,
                               seconds=seconds, every=every, alpha=alpha)


def test_one_worker_tau_1_is_the_formulas():
    steps = 6
    net = model()
    optimizer = SGD(net.parameters(), lr=LR, momentum=0.5)
    center = flat(net)
    for step in range(steps):
        x = flat(net)                          # Algorithm 1: both steps from the same x
        elastic = ALPHA * (x - center)         # x_1 ← x − η∇f(x) − α(x − x̃);  x̃ ← x̃ + α(x − x̃)
        sgd_step(net, optimizer, 0, step)
        load(net, flat(net) - elastic)
        center = center + elastic
    center_out, worker_out = run(easgd, 2, step_seconds(1, steps, 1e-3), 1, ALPHA)
    np.testing.assert_allclose(center_out["center"], center, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(worker_out["params"], flat(net), rtol=1e-12, atol=1e-14)
    assert center_out["exchanges"] == [(0, k) for k in range(steps)]


def replay(seconds, every, exchanges):
    """One process: each worker's local steps, the elastic exchanges applied in the given order."""
    workers, steps = seconds.shape
    nets = [model() for _ in range(workers)]
    optimizers = [SGD(net.parameters(), lr=LR, momentum=0.5) for net in nets]
    done, center = [0] * workers, flat(nets[0])
    for w, k in exchanges:
        while done[w] < k:                      # the worker's local steps up to the exchange step k
            sgd_step(nets[w], optimizers[w], w, done[w])
            done[w] += 1
        x = flat(nets[w])                       # step k and the pull both start from x
        elastic = ALPHA * (x - center)
        sgd_step(nets[w], optimizers[w], w, k)
        done[w] += 1
        load(nets[w], flat(nets[w]) - elastic)
        center = center + elastic
    for w in range(workers):
        while done[w] < steps:
            sgd_step(nets[w], optimizers[w], w, done[w])
            done[w] += 1
    return center, [flat(net) for net in nets]


@pytest.mark.parametrize("workers, steps, every", [(3, 7, 2), (4, 6, 1)])
def test_the_center_equals_a_replay_of_the_schedule(workers, steps, every):
    seconds = step_seconds(workers, steps, 1e-3, slowdown=[1.0] * (workers - 1) + [3.0], jitter=0.5,
                           rng=np.random.default_rng(workers))
    results = run(easgd, 1 + workers, seconds, every, ALPHA)
    plan = easgd_schedule(seconds, every, flat(model()).nbytes, LinkModel().alpha, LinkModel().beta)
    assert results[0]["exchanges"] == [(ex.worker, ex.step) for ex in plan]
    assert [t for t, _ in results[0]["history"][1:]] == [ex.replied for ex in plan]
    for w, r in enumerate(results[1:]):         # a worker's clock: its last reply, then its last local steps
        mine = [ex for ex in plan if ex.worker == w]
        t, start = (mine[-1].replied, mine[-1].step + 1) if mine else (0.0, 0)
        for k in range(start, steps):
            t = t + seconds[w, k]
        assert r["clock"] == t
    center, xs = replay(seconds, every, results[0]["exchanges"])
    np.testing.assert_allclose(results[0]["center"], center, rtol=1e-12, atol=1e-14)
    for got, want in zip(results[1:], xs, strict=True):
        np.testing.assert_allclose(got["params"], want, rtol=1e-12, atol=1e-14)
    assert results[0]["exchanges"][-1][0] == workers - 1      # the straggler is served last


def test_the_straggler_does_not_hold_the_others_back():
    seconds = step_seconds(4, 12, 1e-3, slowdown=[1, 1, 1, 3])
    plan = easgd_schedule(seconds, 2, 4000, 5e-6, 4e-11)
    fast = max(ex.replied for ex in plan if ex.worker < 3)
    slow = max(ex.replied for ex in plan if ex.worker == 3)
    assert fast < 0.4 * slow                    # synchronous EASGD would finish everyone at ~slow
    assert sum(ex.worker == 3 for ex in plan) == 6 and len(plan) == 24


@given(workers=st.integers(1, 5), steps=st.integers(1, 7), every=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_every_exchange_once_in_arrival_order(workers, steps, every, seed):
    seconds = np.random.default_rng(seed).exponential(1e-3, size=(workers, steps))
    plan = easgd_schedule(seconds, every, 800, 5e-6, 4e-11)
    assert sorted((ex.worker, ex.step) for ex in plan) == [
        (w, k) for w in range(workers) for k in range(steps) if (k + 1) % every == 0]
    assert [ex.received for ex in plan] == sorted(ex.received for ex in plan)
    for a, b in zip(plan, plan[1:], strict=False):            # the center serves one worker at a time
        assert b.received >= a.replied
    for ex in plan:                             # no exchange before the worker could have computed its steps
        assert ex.received >= seconds[ex.worker, :ex.step + 1].sum() * (1 - 1e-12)


def test_arguments_are_checked():
    seconds = step_seconds(1, 2, 1e-3)
    with pytest.raises(ClusterError, match="alpha must be in"):
        run(easgd, 2, seconds, 1, 1.0)
    with pytest.raises(ClusterError, match="alpha must be in"):
        run(easgd, 2, seconds, 1, 0.0)
    with pytest.raises(ClusterError, match="tau must be an integer >= 1"):
        run(easgd, 2, seconds, 0, 0.5)
    with pytest.raises(ClusterError, match="seconds must have shape"):
        run(easgd, 3, seconds, 1, 0.5)
    with pytest.raises(ClusterError, match="world size >= 2"):
        run(easgd, 1, seconds, 1, 0.5)
    with pytest.raises(ValueError, match="tau"):
        easgd_schedule(np.ones((2, 2)), 1.5, 8, 0.0, 0.0)
    with pytest.raises(ValueError, match="seconds"):
        easgd_schedule(np.ones(3), 1, 8, 0.0, 0.0)
