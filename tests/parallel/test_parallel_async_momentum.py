"""Asynchrony begets momentum: the replay equals the cluster; the best explicit μ falls with P."""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import Linear, MSELoss, Parameter, Sequential, Tanh
from minidist.optim import SGD
from minidist.parallel.asynchronous import (
    best_momentum,
    implicit_momentum,
    least_squares,
    ps_schedule,
    replay_parameter_server,
    sweep_momentum,
    train_parameter_server,
)

X = np.random.default_rng(1).standard_normal((64, 5))
Y = np.random.default_rng(2).standard_normal((64, 3))


def mlp():
    rng = np.random.default_rng(0)
    return Sequential(
        Linear(5, 4, rng=rng, dtype=np.float64), Tanh(), Linear(4, 3, rng=rng, dtype=np.float64)
    )


def batch(worker, step):
    start = (step * 4 + worker) * 3 % 60
    return X[start:start + 3], Y[start:start + 3]


def seconds(workers, steps, seed):
    return np.random.default_rng(seed).exponential(1e-3, size=(workers, steps))


def cluster_run(comm, table, momentum):
    return train_parameter_server(comm, mlp(), MSELoss(), batch, lr=0.1, seconds=table, momentum=momentum,
                                  record_every=2)


@pytest.mark.parametrize("workers, momentum", [(1, 0.0), (3, 0.5), (4, 0.9)])
def test_replay_equals_the_cluster_parameter_server(workers, momentum):
    table = seconds(workers, 5, seed=workers)
    server = run(cluster_run, 1 + workers, table, momentum)[0]
    replay = replay_parameter_server(mlp(), MSELoss(), batch, lr=0.1, seconds=table, momentum=momentum,
                                     record_every=2)
    np.testing.assert_allclose(replay["params"], server["shard"], rtol=1e-12, atol=1e-14)
    assert replay["staleness"] == server["staleness"]
    assert replay["times"] == server["times"]
    assert [t for t, _ in replay["history"]] == [t for t, _ in server["history"]]
    for (_, got), (_, want) in zip(replay["history"], server["history"], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_staleness_follows_the_schedule_and_the_queueing_model():
    workers, steps = 8, 200
    table = seconds(workers, steps, seed=5)
    replay = replay_parameter_server(mlp(), MSELoss(), batch, lr=0.01, seconds=table)
    plan = ps_schedule(table, [8 * 35], [8 * 35], 5e-6, 1 / 25e9)          # 35 parameters, float64
    assert replay["staleness"] == [p.staleness for p in plan.pushes[0]]
    # exponential step times: each update comes from a random worker, staleness ~ Geometric(1/P), mean P−1
    middle = np.array(replay["staleness"][200:-200])
    assert abs(middle.mean() - (workers - 1)) < 0.15 * (workers - 1)
    assert abs(np.mean(middle == 0) - 1 / workers) < 0.04


def test_one_worker_is_momentum_sgd():
    table = seconds(1, 6, seed=0)
    replay = replay_parameter_server(mlp(), MSELoss(), batch, lr=0.1, seconds=table, momentum=0.7)
    net = mlp()
    optimizer = SGD(net.parameters(), lr=0.1, momentum=0.7)
    for step in range(6):
        optimizer.zero_grad()
        loss_fn = MSELoss()
        loss_fn.forward(net.forward(batch(0, step)[0]), batch(0, step)[1])
        net.backward(loss_fn.backward())
        optimizer.step()
    want = np.concatenate([p.data.ravel() for p in net.parameters()])
    np.testing.assert_allclose(replay["params"], want, rtol=1e-12, atol=1e-14)
    assert replay["staleness"] == [0] * 6


def problem():
    x, y = least_squares(100, 10, 100.0, np.random.default_rng(0))
    return x, y, lambda: Linear(10, 1, bias=False, rng=np.random.default_rng(1), dtype=np.float64)


def test_the_best_explicit_momentum_falls_as_workers_are_added():
    x, y, make = problem()
    momenta, budget = np.round(np.arange(0.0, 1.0, 0.1), 1), 160
    loss = lambda flat: np.mean((x @ flat[:, None] - y) ** 2)
    losses = sweep_momentum(make, MSELoss(), lambda w, k: (x, y), loss, lr=0.3, momenta=momenta,
                            seconds_for=lambda p: seconds(p, budget // p, seed=p), workers=[1, 8])
    best = best_momentum(losses, momenta)
    assert best[1] < best[0]
    assert np.isinf(losses[1, -1]) or losses[1, -1] > 10 * losses[1].min()    # μ = 0.9 with P = 8: too much


def test_asynchronous_sgd_behaves_like_heavy_ball_with_implicit_momentum():
    """E[w_{t+1} − w_t] = (1 − 1/P) E[w_t − w_{t−1}] − (lr/P) ∇f: SGD(lr/P, momentum=1 − 1/P)."""
    x, y, make = problem()
    workers, budget, lr = 4, 200, 0.2
    loss = lambda flat: float(np.mean((x @ flat[:, None] - y) ** 2))
    finals = [loss(replay_parameter_server(make(), MSELoss(), lambda w, k: (x, y), lr=lr,
                                           seconds=seconds(workers, budget // workers, seed))["params"])
              for seed in range(3)]
    w = Parameter(np.concatenate([p.data.ravel() for p in make().parameters()]))
    heavy_ball = SGD([w], lr=lr / workers, momentum=implicit_momentum(workers))
    for _ in range(budget):
        w.grad[...] = (2 / len(y)) * (x.T @ (x @ w.data[:, None] - y)).ravel()
        heavy_ball.step()
    assert 0.75 < np.median(finals) / loss(w.data) < 1.33


def test_arguments_are_checked():
    assert implicit_momentum(1) == 0.0 and implicit_momentum(4) == 0.75
    with pytest.raises(ValueError, match="workers"):
        implicit_momentum(0)
    with pytest.raises(ValueError, match="momentum"):
        replay_parameter_server(mlp(), MSELoss(), batch, lr=0.1, seconds=seconds(2, 2, 0), momentum=1.0)
    with pytest.raises(ValueError, match="lr"):
        replay_parameter_server(mlp(), MSELoss(), batch, lr=0.0, seconds=seconds(2, 2, 0))
    with pytest.raises(ValueError, match="staleness bound"):
        replay_parameter_server(mlp(), MSELoss(), batch, lr=0.1, seconds=seconds(2, 2, 0), bound=-1)
    with pytest.raises(ValueError, match="seconds_for"):
        sweep_momentum(mlp, MSELoss(), batch, lambda f: 0.0, lr=0.1, momenta=[0.0],
                       seconds_for=lambda p: np.ones((1, 2)), workers=[2])
    with pytest.raises(ValueError, match="shape"):
        best_momentum(np.ones((2, 3)), [0.0, 0.5])
    with pytest.raises(ValueError, match="features <= samples"):
        least_squares(3, 5, 10.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="condition"):
        least_squares(10, 5, 0.5, np.random.default_rng(0))
