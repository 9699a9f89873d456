"""Training an MLP with tensor parallelism (seed scheme, Megatron) and the 2×2 hybrid: per parameter, after
every step, equal to single-process training (float64); the ledger's bytes per step equal the formulas."""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD
from minidist.parallel import Mesh
from minidist.parallel.grids import hybrid_train_step, mesh_bytes_sent
from minidist.parallel.tensor import (
    ColumnParallelLinear,
    MegatronMLP,
    column_parallel_mlp,
    megatron_parallel_mlp,
)
from minidist.parallel.tensor.cost import (
    column_parallel_words,
    data_parallel_words,
    hybrid_words,
    megatron_words,
    seed_t_comm_data,
    seed_t_comm_model,
)

STEPS = 4
WIDTHS = [7, 10, 5, 11, 6]  # output widths: none divisible by 3 or 4
BATCH = 9


def _mlp(widths, bias=True, seed=0):
    rng = np.random.default_rng(seed)
    layers = []
    for i in range(1, len(widths)):
        layers += [Linear(widths[i - 1], widths[i], bias, rng=rng, dtype=np.float64), ReLU()]
    return Sequential(*layers[:-1])


def _batch(widths, batch, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, widths[0])), rng.integers(0, widths[-1], batch)


def _shards_by_full_name(model):
    """{name in the full Sequential: (this rank's shard, the index that cuts it from the full array)}."""
    out, i = {}, 0
    for layer in model:
        if isinstance(layer, ColumnParallelLinear):
            out[f"{i}.weight"] = (layer.weight.data.copy(), (layer.rows,))
            if layer.bias is not None:
                out[f"{i}.bias"] = (layer.bias.data.copy(), (layer.rows,))
        elif isinstance(layer, MegatronMLP):
            out[f"{i}.weight"] = (layer.up.weight.data.copy(), (layer.up.rows,))
            out[f"{i + 2}.weight"] = (layer.down.weight.data.copy(), (slice(None), layer.down.cols))
            if layer.up.bias is not None:
                out[f"{i}.bias"] = (layer.up.bias.data.copy(), (layer.up.rows,))
                out[f"{i + 2}.bias"] = (layer.down.bias.data.copy(), (slice(None),))
            i += 2
        i += 1
    return out


def _train_worker(comm, scheme, widths, batch, bias, tensor=None):
    full = _mlp(widths, bias)
    x, labels = _batch(widths, batch)
    mesh = Mesh(comm, data=comm.world_size // tensor, tensor=tensor) if tensor is not None else None
    group = mesh.group("tensor") if mesh is not None else comm
    build = column_parallel_mlp if scheme == "column" else megatron_parallel_mlp
    model = build(group, full)
    opt, loss_fn = SGD(model.parameters(), lr=0.1, momentum=0.9), CrossEntropyLoss()
    history, sent = [], []
    for _ in range(STEPS):
        before = mesh_bytes_sent(mesh) if mesh is not None else comm.stats.bytes_sent
        if mesh is not None:
            hybrid_train_step(mesh, model, loss_fn, opt, x, labels)
        else:
            opt.zero_grad()
            loss_fn.forward(model(x), labels)
            model.backward(loss_fn.backward())
            opt.step()
        sent.append((mesh_bytes_sent(mesh) if mesh is not None else comm.stats.bytes_sent) - before)
        history.append(_shards_by_full_name(model))
    return history, sent, sum(p.size for p in model.parameters())


def _reference(widths, batch, bias):
    model = _mlp(widths, bias)
    x, labels = _batch(widths, batch)
    opt, loss_fn = SGD(model.parameters(), lr=0.1, momentum=0.9), CrossEntropyLoss()
    history = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss_fn.forward(model(x), labels)
        model.backward(loss_fn.backward())
        opt.step()
        history.append({f"{i}.{name}": p.data.copy() for i, layer in enumerate(model)
                        for name, p in layer.named_parameters()})
    return history


def _assert_trains_like_one_process(per_rank, widths, batch, bias):
    expected = _reference(widths, batch, bias)
    for step in range(STEPS):
        for history, _, _ in per_rank:
            shards = history[step]
            assert set(shards) == set(expected[step])  # every parameter of the full model is checked
            for name, (shard, index) in shards.items():
                np.testing.assert_allclose(shard, expected[step][name][index], rtol=1e-10, atol=1e-12,
                                           err_msg=f"step {step + 1}, parameter {name}")


@pytest.mark.parametrize("parts, bias", [(3, True), (4, False)])
def test_parallel_tensor_column_scheme_trains_like_one_process(parts, bias):
    per_rank = run(_train_worker, parts, "column", WIDTHS, BATCH, bias, timeout=60.0)
    _assert_trains_like_one_process(per_rank, WIDTHS, BATCH, bias)
    words = column_parallel_words(WIDTHS, BATCH, parts)
    for step in range(STEPS):
        assert sum(sent[step] for _, sent, _ in per_rank) == 8 * words


@pytest.mark.exercise("megatron_mlp")
@pytest.mark.parametrize("parts, bias", [(2, False), (3, True)])
def test_parallel_tensor_megatron_trains_like_one_process(parts, bias):
    per_rank = run(_train_worker, parts, "megatron", WIDTHS, BATCH, bias, timeout=60.0)
    _assert_trains_like_one_process(per_rank, WIDTHS, BATCH, bias)
    words = megatron_words(WIDTHS, BATCH, parts)
    for step in range(STEPS):
        assert sum(sent[step] for _, sent, _ in per_rank) == 8 * words


@pytest.mark.exercise("megatron_mlp")
def test_parallel_tensor_hybrid_2x2_trains_like_one_process():
    per_rank = run(_train_worker, 4, "megatron", WIDTHS, BATCH, True, 2, timeout=60.0)
    _assert_trains_like_one_process(per_rank, WIDTHS, BATCH, True)
    # Ranks 0 and 1 form row 0 (model-parallel); column p = ranks p and p + 2 hold the same shard.
    shard_sizes = [per_rank[p][2] for p in range(2)]
    assert shard_sizes == [per_rank[p + 2][2] for p in range(2)]
    words = hybrid_words(megatron_words(WIDTHS, BATCH, 2), shard_sizes, data_parallel=2)
    for step in range(STEPS):
        assert sum(sent[step] for _, sent, _ in per_rank) == 8 * words


def _square_step_bytes(comm, d, layers, batch, tensor):
    """Bytes one rank sends in one training step of L square d×d layers, no biases."""
    widths = [d] * (layers + 1)
    _, sent, _ = _train_worker(comm, "column", widths, batch, False, tensor)
    return sent


def test_parallel_tensor_ledger_per_rank_equals_seed_formulas():
    d, layers, batch, parts = 8, 3, 12, 4
    widths = [d] * (layers + 1)
    per_rank = run(_square_step_bytes, parts, d, layers, batch, parts, timeout=60.0)  # model parallel
    assert all(step == 8 * seed_t_comm_model(widths, batch, parts) for sent in per_rank for step in sent)
    per_rank = run(_square_step_bytes, parts, d, layers, batch, 1, timeout=60.0)  # data parallel
    assert all(step == 8 * 2 * seed_t_comm_data(widths, parts) for sent in per_rank for step in sent)
    assert 2 * parts * seed_t_comm_data(widths, parts) == data_parallel_words(layers * d * d, parts)


def test_parallel_tensor_hybrid_bad_arguments():
    class TwoRanks:  # only its size is read before the error
        rank, world_size = 0, 2

    with pytest.raises(ValueError, match="multiply to 3, but the world size is 2"):
        Mesh(TwoRanks(), tensor=3)
