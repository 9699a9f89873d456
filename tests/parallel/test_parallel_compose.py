"""Strategies composed through the step runner that no file composes by hand: ZeRO-1, ZeRO-2 and FSDP over
the data group of a data × tensor grid whose model is Megatron-parallel (each data group shards the
tensor-parallel shards), and mixed precision under it. Per parameter after several Adam steps, equal to
one process training the whole model on the whole batch (float64; mixed: to the same run without ZeRO)."""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential, Tanh
from minidist.optim import SGD, Adam
from minidist.parallel.data import ShardedMixedPrecision, ZeRO
from minidist.parallel.mesh import Mesh
from minidist.parallel.tensor import megatron_parallel_mlp
from minidist.precision import BF16
from tests.parallel.test_parallel_tensor_training import _shards_by_full_name

STEPS, BATCH = 3, 7


def _model(dtype=np.float64):
    rng = np.random.default_rng(5)
    return Sequential(Linear(6, 10, rng=rng, dtype=dtype), ReLU(), Linear(10, 5, rng=rng, dtype=dtype),
                      ReLU(), Linear(5, 9, rng=rng, dtype=dtype), Tanh(), Linear(9, 4, rng=rng, dtype=dtype))


def _batches():
    rng = np.random.default_rng(6)
    return [(rng.standard_normal((BATCH, 6)), rng.integers(0, 4, BATCH)) for _ in range(STEPS)]


def _one_process(make_optimizer) -> dict:
    """The whole model trained on the whole batches in one process (float64): its parameters by name."""
    model = _model()
    optimizer, loss_fn = make_optimizer(model.parameters()), CrossEntropyLoss()
    for x, y in _batches():
        optimizer.zero_grad()
        loss_fn.forward(model.forward(x), y)
        model.backward(loss_fn.backward())
        optimizer.step()
    return dict(model.named_parameters())


def _grid_train(comm, stage):
    mesh = Mesh(comm, data=2, tensor=2)                            # 2 data groups × 2 tensor ranks
    model = megatron_parallel_mlp(mesh.group("tensor"), _model())
    zero = ZeRO(mesh.group("data"), model, lambda shards: Adam(shards, lr=0.05),
                              CrossEntropyLoss(), stage=stage)
    for x, y in _batches():
        zero.train_step(x, y)
    for p, full in zip(model.parameters(), zero.full_parameters(), strict=True):
        p.data = full
    return _shards_by_full_name(model)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_parallel_zero_over_the_data_group_of_a_data_by_tensor_grid_equals_one_process(stage):
    full = _one_process(lambda params: Adam(params, lr=0.05))
    results = run(_grid_train, 4, stage)
    for shards in results:
        assert len(shards) == len(full)
        for name, (shard, index) in shards.items():
            np.testing.assert_allclose(shard, full[f"layers.{name}"].data[index], rtol=1e-9, atol=1e-12)


def _mixed_grid_train(comm):
    mesh = Mesh(comm, data=2, tensor=2)
    model = megatron_parallel_mlp(mesh.group("tensor"), _model(np.float32))
    zero = ZeRO(mesh.group("data"), model, lambda shards: SGD(shards, lr=0.1), CrossEntropyLoss(), stage=2,
                mixed=ShardedMixedPrecision(BF16))
    for x, y in _batches():
        zero.train_step(x.astype(np.float32), y)
    for p, master in zip(model.parameters(), zero.master_parameters(), strict=True):
        p.data = master
    return _shards_by_full_name(model)


def test_parallel_mixed_precision_under_zero2_over_the_data_group_of_a_grid():
    """bf16 forward/backward with fp32 master shards, attached under ZeRO-2 over the data group of the
    2 × 2 grid: the data replicas of each tensor shard agree bitwise, and the masters follow one
    process's float64 training to within bf16's rounding (measured 5e-4; the parameters move 7e-2)."""
    full = _one_process(lambda params: SGD(params, lr=0.1))
    results = run(_mixed_grid_train, 4)
    for a, b in ((0, 2), (1, 3)):                # ranks (row 0, column c) and (row 1, column c)
        for name in results[a]:
            np.testing.assert_array_equal(results[a][name][0], results[b][name][0])
    for shards in results:
        for name, (shard, index) in shards.items():
            np.testing.assert_allclose(shard, full[f"layers.{name}"].data[index], rtol=0, atol=3e-3)
