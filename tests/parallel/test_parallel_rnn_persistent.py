"""The distributed persistent RNN: hidden units split over 1–5 ranks; per parameter, after every SGD
step, equal to one process (float64); one exchange per timestep each way, bytes equal the formula."""

from __future__ import annotations

import numpy as np
import pytest

from minidist.cluster import run
from minidist.collectives.pieces import split_range
from minidist.nn import RNN, Linear
from minidist.optim import SGD
from minidist.parallel.rnn import PersistentRNN

T, N, INPUT, HIDDEN, STEPS = 5, 3, 4, 7, 3          # HIDDEN = 7: uneven splits for P = 2 … 5


def _data():
    rng = np.random.default_rng(1)
    return rng.standard_normal((STEPS, T, N, INPUT)), rng.standard_normal((STEPS, T, N, HIDDEN))


def _train(model, xs, targets):
    """Mean-squared error training; returns every step's dx."""
    opt, dxs = SGD(model.parameters(), lr=0.1, momentum=0.9), []
    for x, target in zip(xs, targets, strict=True):
        y, _ = model.forward(x)
        opt.zero_grad()
        dxs.append(model.backward((y - target) / y.size))
        opt.step()
    return dxs


def _full():
    return RNN(INPUT, HIDDEN, rng=np.random.default_rng(0), dtype=np.float64)


def _rank(comm):
    model = PersistentRNN(comm, _full())
    before = comm.stats.bytes_sent
    model.forward(_data()[0][0])
    forward_bytes = comm.stats.bytes_sent - before
    model.zero_grad()
    dxs = _train(model, *_data())
    return {name: p.data for name, p in model.named_parameters()}, dxs, forward_bytes


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_persistent_rnn_equals_one_process_per_parameter(world_size):
    reference = _full()
    ref_dxs = _train(reference, *_data())
    results = run(_rank, world_size)
    for rank, (params, dxs, forward_bytes) in enumerate(results):
        lo, hi = split_range(HIDDEN, world_size, rank)
        for name, shard in params.items():
            np.testing.assert_allclose(shard, getattr(reference, name).data[lo:hi], rtol=1e-12, atol=1e-13)
        for dx, ref in zip(dxs, ref_dxs, strict=True):
            np.testing.assert_allclose(dx, ref, rtol=1e-12, atol=1e-14)
        # forward: one allgather of h_t per step; rank r sends its own piece to each of the P - 1 others
        assert forward_bytes == T * N * (world_size - 1) * (hi - lo) * 8


def test_persistent_rnn_refuses_what_it_does_not_split():
    with pytest.raises(TypeError, match="tanh, bias=True"):
        PersistentRNN(None, RNN(2, 3, nonlinearity="relu", rng=np.random.default_rng(0)))
    with pytest.raises(TypeError, match="nn.RNN"):
        PersistentRNN(None, Linear(2, 3, rng=np.random.default_rng(0)))


def _with_final_gradient(comm, x, dy, dh_n):
    model = PersistentRNN(comm, _full())
    model.forward(x)
    return model.backward(dy, dh_n), model.weight_hh_l0.grad


def test_persistent_rnn_takes_the_final_states_gradient_as_nn_rnn_does():
    rng = np.random.default_rng(9)
    x, dy, dh_n = rng.standard_normal((T, N, INPUT)), rng.standard_normal((T, N, HIDDEN)), \
        rng.standard_normal((1, N, HIDDEN))
    reference = _full()
    reference.forward(x)
    ref_dx = reference.backward(dy, dh_n)
    for rank, (dx, grad) in enumerate(run(_with_final_gradient, 3, x, dy, dh_n)):
        lo, hi = split_range(HIDDEN, 3, rank)
        np.testing.assert_allclose(dx, ref_dx, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(grad, reference.weight_hh_l0.grad[lo:hi], rtol=1e-12, atol=1e-14)
