"""The asynchronous parameter server: s = 0 is synchronous SGD per parameter; clocks and staleness follow the
schedule."""

import numpy as np
import pytest

from minidist.cluster import ClusterError, LinkModel, run
from minidist.nn import MSELoss
from minidist.parallel.asynchronous import ps_schedule, step_seconds, train_parameter_server
from tests.parallel.async_helpers import batch, model

DIMS, STEPS, LR = (5, 4, 3), 4, 0.1


def synchronous_reference(workers):
    """One process: at every step, the sum of every worker's gradient at the same parameters."""
    net, loss_fn = model(), MSELoss()
    for step in range(STEPS):
        grads = []
        for w in range(workers):
            net.zero_grad()
            x, y = batch(w, step)
            loss_fn.forward(net.forward(x), y)
            net.backward(loss_fn.backward())
            grads.append([p.grad.copy() for p in net.parameters()])
        for i, p in enumerate(net.parameters()):
            p.data -= LR * sum(g[i] for g in grads)
    return np.concatenate([p.data.ravel() for p in net.parameters()])


def train(comm, servers, seconds, bound):
    return train_parameter_server(comm, model(), MSELoss(), batch, lr=LR, seconds=seconds, servers=servers,
                                  bound=bound)


@pytest.mark.parametrize("servers, workers", [(1, 2), (1, 3), (2, 2)])
def test_bound_zero_is_synchronous_parameter_server_sgd(servers, workers):
    seconds = step_seconds(workers, STEPS, 1e-3, slowdown=[1.0] * (workers - 1) + [3.0])
    results = run(train, servers + workers, servers, seconds, 0)
    got = np.concatenate([r["shard"] for r in results[:servers]])
    want = synchronous_reference(workers)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    for r in results[:servers]:    # within a round the j-th push has seen j updates since the pull
        assert max(r["staleness"]) == workers - 1


def test_clocks_and_staleness_follow_the_schedule():
    servers, workers = 2, 3
    seconds = step_seconds(workers, STEPS, 1e-4, slowdown=[1, 1, 3], jitter=0.5, rng=np.random.default_rng(3))
    results = run(train, servers + workers, servers, seconds, None)
    n = sum(p.size for p in model().parameters())
    sizes = [((n + 1) // 2) * 8, (n // 2) * 8]
    plan = ps_schedule(seconds, sizes, sizes, LinkModel().alpha, LinkModel().beta)
    for j in range(servers):
        assert results[j]["staleness"] == [p.staleness for p in plan.pushes[j]]
    assert [r["clock"] for r in results[servers:]] == plan.worker_clock.tolist()
    assert max(results[0]["staleness"]) > workers - 1       # the fast workers overtake the straggler


def test_asynchronous_does_not_wait_for_the_straggler():
    seconds = step_seconds(4, 20, 1e-3, slowdown=[1, 1, 1, 3])
    sync = ps_schedule(seconds, [4000], [4000], 5e-6, 4e-11, bound=0)
    free = ps_schedule(seconds, [4000], [4000], 5e-6, 4e-11, bound=None)
    # the same 80 pushes; synchronous takes as long as the straggler's 20 slow steps plus waiting
    assert free.worker_clock[:3].max() < 0.5 * sync.worker_clock[:3].max()


def test_arguments_are_checked():
    seconds = step_seconds(1, 2, 1e-3)
    with pytest.raises(ClusterError, match="servers < world size"):
        run(train, 2, 2, seconds, None)
    with pytest.raises(ClusterError, match="staleness bound"):
        run(train, 2, 1, seconds, -1)
    with pytest.raises(ClusterError, match="seconds must have shape"):
        run(train, 3, 1, seconds, None)
    with pytest.raises(ValueError, match="slowdown"):
        step_seconds(2, 3, 1.0, slowdown=[1.0])
    with pytest.raises(ValueError, match="rng"):
        step_seconds(2, 3, 1.0, jitter=0.1)
