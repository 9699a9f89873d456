"""Compressed data parallelism: top-k with k = n is plain training; bytes per step in the ledger."""

import numpy as np
import pytest

from minidist.cluster import ClusterError, run
from minidist.nn import Linear, MSELoss, Sequential, Tanh
from minidist.optim import SGD
from minidist.parallel.compression import CompressedDataParallel, ErrorFeedback, OneBit, TopK

X = np.random.default_rng(1).standard_normal((40, 5))
Y = np.random.default_rng(2).standard_normal((40, 3))
STEPS, BATCH, LR = 4, 10, 0.1


def model():
    rng = np.random.default_rng(0)
    return Sequential(
        Linear(5, 4, rng=rng, dtype=np.float64), Tanh(), Linear(4, 3, rng=rng, dtype=np.float64)
    )


def train(comm, kind):
    net = model()
    n = sum(p.size for p in net.parameters())
    codec = {"topk_all": TopK(n, k=n, dtype=np.float64), "onebit": OneBit([p.shape for p in net.parameters()],
                                                                           dtype=np.float64)}[kind]
    dp = CompressedDataParallel(
        comm, net, SGD(net.parameters(), lr=LR, momentum=0.9), MSELoss(), ErrorFeedback(codec)
    )
    for step in range(STEPS):
        dp.train_step(X[step * BATCH:(step + 1) * BATCH], Y[step * BATCH:(step + 1) * BATCH])
    return np.concatenate([p.data.ravel() for p in net.parameters()]), dp.bytes_per_step, codec.message_bytes


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_topk_with_k_equal_n_is_uncompressed_training(world_size):
    net, loss_fn = model(), MSELoss()
    opt = SGD(net.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        loss_fn.forward(net.forward(X[step * BATCH:(step + 1) * BATCH]), Y[step * BATCH:(step + 1) * BATCH])
        net.backward(loss_fn.backward())
        opt.step()
    results = run(train, world_size, "topk_all")
    for got, _, _ in results:
        offset = 0
        for p in net.parameters():      # per parameter
            np.testing.assert_allclose(got[offset:offset + p.size], p.data.ravel(), rtol=1e-12, atol=1e-14)
            offset += p.size
        assert np.array_equal(got, results[0][0])


@pytest.mark.parametrize("world_size", [2, 4])
def test_bytes_per_step_in_the_ledger(world_size):
    for _, per_step, message in run(train, world_size, "onebit"):
        assert per_step == [(world_size - 1) * message] * STEPS


def bad(comm):
    net = model()
    CompressedDataParallel(comm, net, SGD(net.parameters(), lr=LR), MSELoss(), ErrorFeedback(TopK(5, k=1)))


def test_arguments_are_checked():
    with pytest.raises(ClusterError, match="built for 5 entries"):
        run(bad, 1)
