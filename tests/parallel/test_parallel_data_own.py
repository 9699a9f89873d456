"""dp_bucketed_allreduce's own tests: DataParallel on a model that reaches no other exercise.

The model is Affine/Tanh layers (tests/own_helpers.py) with MSELoss and plain SGD; the gradients travel
by allreduce algorithms that are not exercises. The property of the exercise: after the bucketed
allreduce every rank holds, per parameter, the full-batch gradient, so several steps of data-parallel
training equal the same steps in one process, and the replicas stay bitwise identical.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.cluster import run
from minidist.nn import MSELoss
from minidist.optim import SGD
from minidist.parallel import DataParallel
from tests.own_helpers import NON_EXERCISE_ALGORITHMS, affine_model, regression_batches

FEATURES, DEPTH, STEPS, LR = 5, 3, 3, 0.1


def single_process(seed, batches):
    """Full-batch SGD in one process: (gradients of the first step, parameters after every step)."""
    model = affine_model(FEATURES, DEPTH, seed)
    opt, loss_fn, history, first_grads = SGD(model.parameters(), lr=LR), MSELoss(), [], None
    for x, y in batches:
        model.zero_grad()
        loss_fn.forward(model.forward(x), y)
        model.backward(loss_fn.backward())
        if first_grads is None:
            first_grads = [p.grad.copy() for p in model.parameters()]
        opt.step()
        history.append([p.data.copy() for p in model.parameters()])
    return first_grads, history


def data_parallel(comm, seed, batches, algorithm, bucket_bytes, overlap):
    model = affine_model(FEATURES, DEPTH, seed)
    opt = SGD(model.parameters(), lr=LR)
    dp = DataParallel(comm, model, opt, MSELoss(), algorithm=algorithm, bucket_bytes=bucket_bytes,
                      overlap=overlap)
    history, first_grads = [], None
    for x, y in batches:
        dp.zero_grad()
        dp.forward_backward(x, y)
        if first_grads is None:
            first_grads = [p.grad.copy() for p in model.parameters()]
        dp.step()
        history.append([p.data.copy() for p in model.parameters()])
    dp.check_replicas()
    return first_grads, history, len(dp.buckets)


def check(world_size, batch, algorithm, bucket_bytes, overlap=True, seed=0):
    batches = regression_batches(seed, STEPS, batch, FEATURES)
    grads, history = single_process(seed, batches)
    results = run(data_parallel, world_size, seed, batches, algorithm, bucket_bytes, overlap, timeout=120)
    for rank, (dp_grads, dp_history, _) in enumerate(results):
        for i, (g, h) in enumerate(zip(dp_grads, grads, strict=True)):
            np.testing.assert_allclose(g, h, rtol=1e-12, atol=1e-15,
                                       err_msg=f"rank {rank}: gradient of parameter {i} after one step")
        for step, (got, want) in enumerate(zip(dp_history, history, strict=True)):
            for i, (p, q) in enumerate(zip(got, want, strict=True)):
                np.testing.assert_allclose(p, q, rtol=1e-12, atol=1e-15,
                                           err_msg=f"rank {rank}, step {step}: parameter {i}")
    for rank in range(1, world_size):  # every replica is bitwise rank 0's, step after step
        for got, want in zip(results[rank][1], results[0][1], strict=True):
            assert all(np.array_equal(p, q) for p, q in zip(got, want, strict=True)), \
                f"rank {rank} drifted from rank 0"
    return results


@pytest.mark.parametrize("algorithm", NON_EXERCISE_ALGORITHMS)
@pytest.mark.parametrize("world_size, batch", [(2, 8), (3, 7), (4, 10)])
def test_bucketed_allreduce_gives_the_full_batch_gradient(algorithm, world_size, batch):
    """Shards of unequal size (7 over 3 ranks) still add up to the full-batch average."""
    check(world_size, batch, algorithm, bucket_bytes=64)


@pytest.mark.parametrize("bucket_bytes, buckets", [(None, 6), (1, 6), (80, 3), (2**20, 1)])
def test_every_bucket_layout_gives_the_same_training(bucket_bytes, buckets):
    """One allreduce per parameter, per pair of parameters, or of the whole model: same result.

    The model has 6 parameters of 5 float64 (40 bytes each): 80 bytes close a bucket after 2 of them."""
    results = check(3, 9, "recursive_doubling", bucket_bytes)
    assert [r[2] for r in results] == [buckets] * 3


def test_bucketed_allreduce_without_overlap():
    check(2, 6, "naive", bucket_bytes=80, overlap=False)


@settings(max_examples=6)
@given(
    world_size=st.integers(2, 4),
    extra=st.integers(0, 5),
    seed=st.integers(0, 2**16),
    algorithm=st.sampled_from(NON_EXERCISE_ALGORITHMS),
    bucket_bytes=st.sampled_from([None, 40, 100, 10**6]),
)
def test_bucketed_allreduce_hypothesis(world_size, extra, seed, algorithm, bucket_bytes):
    check(world_size, world_size + extra, algorithm, bucket_bytes, seed=seed)
