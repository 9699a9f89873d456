"""The exercise zero1_shard_update: ZeRO-1 trains exactly like full-batch training in one process.

Reaches no other exercise: a test-local element-wise model (y = tanh(x·w + c)), MSELoss, and optimizers
whose updates are not exercises (plain SGD, RMSprop, Adagrad); the collectives used are reduce_scatter
and allgather. P = 1-4, parameter sizes not divisible by P.
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import Module, MSELoss, Parameter, Sequential, Tanh
from minidist.optim import SGD, Adagrad, RMSprop
from minidist.parallel.data.zero import ZeRO
from tests.parallel.zero1_diagnosis import diagnose_zero1

OPTIMIZERS = {"sgd": lambda ps: SGD(ps, lr=0.3), "rmsprop": lambda ps: RMSprop(ps, lr=0.01, alpha=0.9),
              "adagrad": lambda ps: Adagrad(ps, lr=0.1)}


class Scale(Module):
    """y = x · w + c, element-wise over the features: w, c of shape (features,)."""

    def __init__(self, features: int, rng: np.random.Generator):
        self.w = Parameter(rng.normal(size=features))
        self.c = Parameter(rng.normal(size=features))

    def forward(self, x):
        self._x = x
        self.remember_output_shape(x.shape)
        return x * self.w.data + self.c.data

    def backward(self, dy):
        self.check_upstream(dy)
        self.w.grad += (dy * self._x).sum(axis=0)
        self.c.grad += dy.sum(axis=0)
        return dy * self.w.data


@pytest.mark.exercise("zero1_shard_update")
@pytest.mark.diagnose
def test_each_shard_steps_on_its_piece_of_the_sum_and_every_rank_gathers_every_piece():
    for world in (1, 2, 3):
        wrong = diagnose_zero1(world)
        assert wrong is None, wrong


def make_model(features: int, seed: int) -> Sequential:
    rng = np.random.default_rng(seed)
    return Sequential(Scale(features, rng), Tanh(), Scale(features, rng))


def make_batches(features: int, seed: int, steps: int = 4, batch: int = 9):
    rng = np.random.default_rng([seed, 1])
    return [(rng.normal(size=(batch, features)), rng.normal(size=(batch, features))) for _ in range(steps)]


def reference(features, seed, optimizer):
    model = make_model(features, seed)
    opt, loss_fn, history = OPTIMIZERS[optimizer](model.parameters()), MSELoss(), []
    for x, y in make_batches(features, seed):
        opt.zero_grad()
        loss_fn.forward(model.forward(x), y)
        model.backward(loss_fn.backward())
        opt.step()
        history.append([p.data.copy() for p in model.parameters()])
    return history


def _zero1(comm, features, seed, optimizer, bucket_bytes):
    zero = ZeRO(comm, make_model(features, seed), OPTIMIZERS[optimizer], MSELoss(), stage=1,
                bucket_bytes=bucket_bytes)
    history = []
    for x, y in make_batches(features, seed):
        zero.train_step(x, y)
        history.append(zero.full_parameters())
    return history, zero.held()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_parallel_zero_exercise_zero1_equals_single_process(world_size, optimizer):
    features, seed = 7, world_size                      # 4 parameters of 7: sizes not divisible by P
    expected = reference(features, seed, optimizer)
    for bucket_bytes in (None, 10**6):                 # one bucket per parameter, or one for all
        results = run(_zero1, world_size, features, seed, optimizer, bucket_bytes)
        for history, _ in results:
            for got, want in zip(history, expected, strict=True):
                for a, b in zip(got, want, strict=True):
                    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
        first = results[0][0]                           # every rank ends with bitwise the same parameters
        for history, _ in results[1:]:
            for a, b in zip(history[-1], first[-1], strict=True):
                np.testing.assert_array_equal(a, b)
        if optimizer != "sgd":                          # one state array per element, sharded: 8·Ψ_r bytes
            held = [h for _, h in results]
            assert sum(h["optimizer"] for h in held) == 8 * 4 * features
