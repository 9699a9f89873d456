"""SyncBatchNorm under data parallelism equals full-batch single-process BatchNorm training (issue 21).

Per parameter and per running statistic, after every step, float64, rtol 1e-9: P = 1-4, uneven shards,
every allreduce algorithm, by hand (shard, backward, allreduce, step) and through DataParallel. Then the
edge cases: an empty shard, bad input, convert_sync_batchnorm; and the exercise test, which reaches
only SyncBatchNorm's backward (a float64 finite difference of the global function, written here).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.cluster import ClusterError, run
from minidist.collectives import ALGORITHMS, allreduce
from minidist.collectives.pieces import split_range
from minidist.nn import (
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    CrossEntropyLoss,
    Flatten,
    Linear,
    ReLU,
    Sequential,
)
from minidist.optim import SGD
from minidist.parallel.data import DataParallel
from minidist.parallel.sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm
from tests.parallel.sync_batchnorm_diagnosis import diagnose_sync_batchnorm, global_bn, sync_backward_worker

RTOL = 1e-9
STEPS = 3


def make_model(kind: str, seed: int = 5) -> Sequential:
    rng = np.random.default_rng(seed)
    if kind == "mlp":
        return Sequential(
            Linear(5, 7, rng=rng, dtype=np.float64),
            BatchNorm1d(7, momentum=0.3, dtype=np.float64),
            ReLU(),
            Linear(7, 3, rng=rng, dtype=np.float64),
        )
    return Sequential(Conv2d(2, 3, 3, padding=1, rng=rng, dtype=np.float64), BatchNorm2d(3, dtype=np.float64),
                      ReLU(), Flatten(), Linear(3 * 4 * 4, 3, rng=rng, dtype=np.float64))


def batches(kind: str, sizes, seed: int = 1):
    rng = np.random.default_rng(seed)
    shape = (5,) if kind == "mlp" else (2, 4, 4)
    # a shifted, scaled input: the statistics matter and are not (0, 1)
    return [(3.0 + 2.0 * rng.standard_normal((b, *shape)), rng.integers(0, 3, size=b)) for b in sizes]


def state(model) -> dict:
    return model.state_dict()   # parameters and running statistics


def single_process(kind, sizes):
    model = make_model(kind)
    opt, loss_fn, history = SGD(model.parameters(), lr=0.2), CrossEntropyLoss(), []
    for x, y in batches(kind, sizes):
        opt.zero_grad()
        loss_fn.forward(model.forward(x), y)
        model.backward(loss_fn.backward())
        opt.step()
        history.append(state(model))
    return history


def by_hand(comm, kind, sizes, algorithm):
    """Shard, forward, backward with weight n_r/B, allreduce every gradient, step."""
    model = convert_sync_batchnorm(make_model(kind), comm, algorithm=algorithm)
    opt, loss_fn, history = SGD(model.parameters(), lr=0.2), CrossEntropyLoss(), []
    for x, y in batches(kind, sizes):
        lo, hi = split_range(len(x), comm.world_size, comm.rank)
        opt.zero_grad()
        loss_fn.forward(model.forward(x[lo:hi]), y[lo:hi])
        model.backward(loss_fn.backward() * ((hi - lo) / len(x)))
        for p in model.parameters():
            p.grad[...] = allreduce(comm, p.grad, algorithm=algorithm)
        opt.step()
        history.append(state(model))
    return history


def with_data_parallel(comm, kind, sizes, algorithm):
    model = convert_sync_batchnorm(make_model(kind), comm, algorithm=algorithm)
    dp = DataParallel(comm, model, SGD(model.parameters(), lr=0.2), CrossEntropyLoss(), algorithm=algorithm,
                      bucket_bytes=256)
    history = []
    for x, y in batches(kind, sizes):
        dp.train_step(x, y)
        history.append(state(model))
    return history


def assert_same(histories, reference, what):
    for rank, history in enumerate(histories):
        for step, (got, want) in enumerate(zip(history, reference, strict=True)):
            for name, value in want.items():
                np.testing.assert_allclose(got[name], value, rtol=RTOL, atol=1e-12,
                                           err_msg=f"{what}: {name}, rank {rank}, step {step}")
    for history in histories[1:]:   # running statistics come from allreduced values: bitwise equal
        for name in reference[-1]:
            if name.endswith(("running_mean", "running_var")):
                assert np.array_equal(history[-1][name], histories[0][-1][name]), name


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_sync_batchnorm_equals_full_batch_for_every_algorithm(algorithm):
    sizes = [7, 10, 9]
    per_rank = run(lambda comm: (by_hand(comm, "mlp", sizes, algorithm),
                                 with_data_parallel(comm, "conv", sizes, algorithm)), 3, timeout=60)
    assert_same([h for h, _ in per_rank], single_process("mlp", sizes), f"by hand, {algorithm}")
    assert_same([h for _, h in per_rank], single_process("conv", sizes), f"DataParallel, {algorithm}")
    moved = [v for k, v in per_rank[0][0][-1].items() if k.endswith("running_mean")]
    assert moved and not np.allclose(moved[0], 0)   # the statistics really moved


@given(world=st.integers(1, 4), extra=st.lists(st.integers(0, 5), min_size=STEPS, max_size=STEPS),
       kind=st.sampled_from(["mlp", "conv"]), algorithm=st.sampled_from(sorted(ALGORITHMS)))
def test_sync_batchnorm_data_parallel_any_world(world, extra, kind, algorithm):
    sizes = [world + 1 + e for e in extra]     # uneven shards; at least one sample per rank
    histories = run(with_data_parallel, world, kind, sizes, algorithm, timeout=60)
    assert_same(histories, single_process(kind, sizes), f"P={world}, {kind}, {algorithm}")


# -- a rank with nothing to normalise, and bad input ----------------------------------------------------

def empty_shard_worker(comm):
    layer = SyncBatchNorm(3, comm=comm, algorithm="recursive_doubling", dtype=np.float64)
    x = np.arange(12.0).reshape(4, 3) ** 1.5 if comm.rank == 0 else np.zeros((0, 3))
    y = layer.forward(x)
    dx = layer.backward(np.ones_like(y) if comm.rank == 0 else np.zeros((0, 3)))
    return y, dx, layer.running_mean.copy(), layer.weight.grad.copy()


def test_sync_batchnorm_empty_shard_joins_without_nan():
    results = run(empty_shard_worker, 3, timeout=60)
    reference = BatchNorm1d(3, dtype=np.float64)
    want = reference.forward(np.arange(12.0).reshape(4, 3) ** 1.5)
    np.testing.assert_allclose(results[0][0], want, rtol=1e-12)
    for rank, (y, dx, running_mean, _) in enumerate(results):
        assert np.isfinite(y).all() and np.isfinite(dx).all(), rank
        assert np.array_equal(running_mean, reference.running_mean), rank
        if rank:
            assert y.shape == dx.shape == (0, 3)


def all_empty_worker(comm):
    SyncBatchNorm(2, comm=comm, dtype=np.float64).forward(np.zeros((0, 2)))


def test_sync_batchnorm_refuses_a_world_without_samples():
    with pytest.raises(ClusterError, match="more than 1 value per channel"):
        run(all_empty_worker, 2, timeout=60)


def test_sync_batchnorm_bad_input_is_a_clear_error():
    def worker(comm):
        layer = SyncBatchNorm(3, comm=comm, dtype=np.float64)
        before = layer.running_mean.copy()
        with pytest.raises(ValueError, match="expected 3 channels"):
            layer.forward(np.ones((4, 2)))
        with pytest.raises(ValueError, match="dimensions"):
            layer.forward(np.ones(3))
        assert np.array_equal(layer.running_mean, before)
        for momentum in (-0.1, 1.5):
            with pytest.raises(ValueError, match="momentum"):
                SyncBatchNorm(3, momentum=momentum, comm=comm)
        with pytest.raises(ValueError, match="algorithm"):
            SyncBatchNorm(3, comm=comm, algorithm="telepathy")
        with pytest.raises(TypeError, match="Communicator"):
            SyncBatchNorm(3, comm=None)
        return True

    assert run(worker, 1, timeout=60) == [True]


def test_convert_sync_batchnorm_keeps_parameters_and_statistics():
    def worker(comm):
        model = Sequential(make_model("conv"), Sequential(BatchNorm1d(3, dtype=np.float64)))
        model[0][1].running_mean[...] = [1.0, 2.0, 3.0]
        params, before = [id(p) for p in model.parameters()], model.state_dict()
        converted = convert_sync_batchnorm(model, comm)
        assert (
            converted is model and type(model[0][1]) is SyncBatchNorm and type(model[1][0]) is SyncBatchNorm
        )
        assert [id(p) for p in model.parameters()] == params
        after = model.state_dict()
        assert all(np.array_equal(after[k], before[k]) for k in before)
        return True

    assert run(worker, 2, timeout=60) == [True, True]


# -- the exercise: SyncBatchNorm's backward, against finite differences of the global function ---------

@pytest.mark.exercise("sync_batchnorm_backward")
@pytest.mark.diagnose
def test_sync_batchnorm_dx_dgamma_dbeta_rank_by_rank():
    for world in (1, 2, 3):
        wrong = diagnose_sync_batchnorm(world, np.random.default_rng(world))
        assert wrong is None, wrong


@pytest.mark.exercise("sync_batchnorm_backward")
@pytest.mark.parametrize("world", [1, 2, 3])
def test_sync_batchnorm_backward_matches_finite_differences(world):
    rng = np.random.default_rng(world)
    x, dy = 1.0 + rng.standard_normal((7, 3)), rng.standard_normal((7, 3))
    gamma, beta = rng.uniform(0.5, 2.0, 3), rng.standard_normal(3)
    results = run(sync_backward_worker, world, x, dy, gamma, beta, timeout=60)
    numeric = {}
    for name, v in (("x", x), ("gamma", gamma), ("beta", beta)):
        grad = np.zeros_like(v)
        for i in np.ndindex(v.shape):
            old = v[i]
            v[i] = old + 1e-6
            up = np.sum(dy * global_bn(x, gamma, beta))
            v[i] = old - 1e-6
            down = np.sum(dy * global_bn(x, gamma, beta))
            v[i] = old
            grad[i] = (up - down) / 2e-6
        numeric[name] = grad
    dx = np.concatenate([r[0] for r in results])
    assert np.abs(dx - numeric["x"]).max() / np.abs(numeric["x"]).max() < 1e-6
    # each rank holds its shard's part of dγ, dβ; their sum is the full gradient
    for k, name in ((1, "gamma"), (2, "beta")):
        total = sum(r[k] for r in results)
        assert np.abs(total - numeric[name]).max() / np.abs(numeric[name]).max() < 1e-6, name
