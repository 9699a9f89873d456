"""Local SGD (H = 1 is synchronous data parallelism) and elastic averaging SGD (against one process)."""

import numpy as np
import pytest

from minidist.cluster import ClusterError, run
from minidist.nn import Linear, MSELoss, Sequential, Tanh
from minidist.optim import SGD
from minidist.parallel.asynchronous import step_seconds, train_elastic, train_local_sgd

STEPS, LR = 4, 0.1
X = np.random.default_rng(1).standard_normal((64, 5))
Y = np.random.default_rng(2).standard_normal((64, 3))


def model():
    rng = np.random.default_rng(0)
    return Sequential(
        Linear(5, 4, rng=rng, dtype=np.float64), Tanh(), Linear(4, 3, rng=rng, dtype=np.float64)
    )


def batch(rank, step):
    start = (step * 4 + rank) * 3 % 60
    return X[start:start + 3], Y[start:start + 3]


def gradient(net, x, y):
    loss_fn = MSELoss()
    net.zero_grad()
    loss_fn.forward(net.forward(x), y)
    net.backward(loss_fn.backward())
    return [p.grad.copy() for p in net.parameters()]


def local(comm, every):
    net = model()
    out = train_local_sgd(
        comm,
        net,
        SGD(net.parameters(), lr=LR),
        MSELoss(),
        batch,
        seconds=step_seconds(comm.world_size, STEPS, 1e-3),
        every=every,
        algorithm="recursive_doubling",
    )
    return np.concatenate([p.data.ravel() for p in net.parameters()]), out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_local_sgd_with_h_1_is_synchronous_data_parallelism(world_size):
    net = model()
    for step in range(STEPS):
        grads = [gradient(net, *batch(r, step)) for r in range(world_size)]
        for i, p in enumerate(net.parameters()):
            p.data -= LR * sum(g[i] for g in grads) / world_size
    want = np.concatenate([p.data.ravel() for p in net.parameters()])
    results = run(local, world_size, 1)
    for got, out in results:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
        assert len(out["averages"]) == STEPS
    assert all(np.array_equal(r[0], results[0][0]) for r in results)


def test_local_sgd_averages_every_h_steps():
    results = run(local, 2, 3)
    assert len(results[0][1]["averages"]) == 2          # after step 3 and after the last step (4)
    assert np.array_equal(results[0][0], results[1][0])


def elastic(comm, every, alpha):
    net = model()
    out = train_elastic(comm, net, SGD(net.parameters(), lr=LR), MSELoss(), batch,
                        seconds=step_seconds(comm.world_size, STEPS, 1e-3), every=every, alpha=alpha,
                        algorithm="recursive_doubling")
    return [np.concatenate([p.data.ravel() for p in net.parameters()]), out["centers"][-1][1]]


def test_elastic_averaging_matches_one_process():
    world_size, every, alpha = 3, 2, 0.2
    nets = [model() for _ in range(world_size)]
    center = np.concatenate([p.data.ravel() for p in nets[0].parameters()])
    for step in range(STEPS):      # equations (5)-(6) of Zhang et al.: both steps from the same x_r,t
        xs = [np.concatenate([p.data.ravel() for p in net.parameters()]) for net in nets]
        for r, net in enumerate(nets):
            for p, g in zip(net.parameters(), gradient(net, *batch(r, step)), strict=True):
                p.data -= LR * g
        if (step + 1) % every == 0:
            new_center = center + alpha * sum(x - center for x in xs)
            for net, x in zip(nets, xs, strict=True):
                x = np.concatenate([p.data.ravel() for p in net.parameters()]) - alpha * (x - center)
                offset = 0
                for p in net.parameters():
                    p.data[...] = x[offset:offset + p.size].reshape(p.shape)
                    offset += p.size
            center = new_center
    results = run(elastic, world_size, every, alpha)
    for r, (got, got_center) in enumerate(results):
        np.testing.assert_allclose(
            got, np.concatenate([p.data.ravel() for p in nets[r].parameters()]), rtol=1e-12, atol=1e-14
        )
        np.testing.assert_allclose(got_center, center, rtol=1e-12, atol=1e-14)


def test_arguments_are_checked():
    with pytest.raises(ClusterError, match="averaging period"):
        run(local, 2, 0)
    with pytest.raises(ClusterError, match="moving rate"):
        run(elastic, 2, 1, 0.6)          # beta = P alpha = 1.2 > 1
    with pytest.raises(ClusterError, match="moving rate"):
        run(elastic, 2, 1, 0.0)
