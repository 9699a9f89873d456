"""Data × pipeline × context × tensor meshes (Mesh + parallelize, minidist/parallel/compose/) train a tiny
GPT like one process: the pipeline schedules on their own.

A float64 GPT (vocabulary 11, 8 positions, 2 blocks, d = 8, 2 heads) pipelined as its units, trained 3 AdamW
steps by D data replicas of a P-rank pipeline under 1F1B, ZB-H1, interleaved (v = 2) and Chimera, and with
tensor-parallel blocks (t = 2) and ring attention over a context group (c = 2); every parameter (shard) each
rank holds and each step's loss must equal one process's."""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import GPT, CrossEntropyLoss
from minidist.optim import AdamW
from minidist.parallel import Mesh, parallelize
from minidist.parallel.tensor import feature_slice

STEPS, N, T, V = 3, 8, 8, 11


def adamw(params):
    return AdamW(params, lr=0.01)


def build() -> GPT:
    return GPT(V, T, 2, 8, 2, rng=np.random.default_rng(5), dtype=np.float64)


def batch():
    rng = np.random.default_rng(9)
    return rng.integers(0, V, size=(N, T)), rng.integers(0, V, size=(N, T))


def reference():
    gpt, (x, y) = build(), batch()
    loss_fn, opt, losses = CrossEntropyLoss(), AdamW(gpt.parameters(), lr=0.01), []
    for _ in range(STEPS):
        gpt.zero_grad()
        losses.append(loss_fn.forward(gpt.forward(x), y))
        gpt.backward(loss_fn.backward())
        opt.step()
    return [p.data for p in gpt.parameters()], losses


def _train(comm, data, schedule, micro_batches, overlap=True, zero=0, bucket_bytes=None):
    """This rank's parameters {index in gpt.parameters(): values}, its losses, the data attachments'
    bucket counts and the elements its optimizer steps."""
    gpt, (x, y) = build(), batch()
    mesh = Mesh(comm, data=data, pipeline=comm.world_size // data)
    options = {} if bucket_bytes is None else dict(bucket_bytes=bucket_bytes)
    trainer = parallelize(gpt, mesh, loss_fn=CrossEntropyLoss(), optimizer=adamw, schedule=schedule,
                          micro_batches=micro_batches, overlap=overlap, zero=zero, **options)
    losses = [trainer.train_step(x, y) for _ in range(STEPS)]
    mine = {id(p) for p in trainer.held}
    held = {i: p.data for i, p in enumerate(gpt.parameters()) if id(p) in mine}
    stepped = sum(p.size for p in trainer.optimizer.params)
    return held, losses, [len(sync.buckets) for sync in trainer.syncs], stepped


CASES = {      # data, schedule, micro-batches, world size
    "dp2 x 1f1b pp2": (2, "1f1b", 2, 4),
    "dp2 x zb-h1 pp2": (2, "zb-h1", 2, 4),
    "dp2 x interleaved pp2 v2": (2, "interleaved", 2, 4),
    "dp1 x chimera pp4": (1, "chimera", 4, 4),
    "dp2 x chimera pp4": (2, "chimera", 4, 8),
}


@pytest.mark.parametrize("name", list(CASES))
def test_parallel_grid_data_pipeline_trains_a_gpt_like_one_process(name):
    data, schedule, micro_batches, world = CASES[name]
    expected, expected_losses = reference()
    results = run(_train, world, data, schedule, micro_batches, timeout=120)
    seen = set()
    for params, *_ in results:
        for i, value in params.items():
            np.testing.assert_allclose(value, expected[i], rtol=1e-9, atol=1e-11)
            seen.add(i)
    assert seen == set(range(len(expected)))
    for _, losses, *_ in results:
        np.testing.assert_allclose(losses, expected_losses, rtol=1e-10)


def test_parallel_grid_data_pipeline_refuses_bad_sizes():
    def bad_data(comm):
        Mesh(comm, data=3)

    with pytest.raises(Exception, match=r"multiply to 3, but the world size is 2"):
        run(bad_data, 2)

    def tied(comm):
        gpt = GPT(V, T, 1, 8, 2, tie_weights=True, rng=np.random.default_rng(0))
        parallelize(gpt, Mesh(comm, pipeline=2), loss_fn=CrossEntropyLoss(), optimizer=AdamW)

    with pytest.raises(Exception, match="untie them"):
        run(tied, 2)


def _expected_shards(block, t, q):
    """The one-process block's parameters cut as tensor rank q of t holds them, in tensor_parallel's
    order."""
    attn, (up, _, down), d = block.attn, list(block.mlp), block.attn.d_model
    heads = feature_slice(attn.n_heads, t, q)
    cols = np.arange(heads.start * attn.d_head, heads.stop * attn.d_head)
    rows = np.concatenate([cols, d + cols, 2 * d + cols])
    hidden = feature_slice(up.out_features, t, q)
    return [block.ln1.weight.data, block.ln1.bias.data, attn.proj.bias.data, attn.qkv.weight.data[rows],
            attn.qkv.bias.data[rows], attn.proj.weight.data[:, cols], block.ln2.weight.data,
            block.ln2.bias.data, up.weight.data[hidden], up.bias.data[hidden], down.weight.data[:, hidden],
            down.bias.data]


def _train_tensor(comm, data, tensor, schedule, micro_batches, context=1):
    gpt, (x, y) = build(), batch()
    mesh = Mesh(comm, data=data, pipeline=comm.world_size // (data * tensor * context), context=context,
                tensor=tensor)
    trainer = parallelize(gpt, mesh, loss_fn=CrossEntropyLoss(), optimizer=adamw, schedule=schedule,
                          micro_batches=micro_batches)
    losses = [trainer.train_step(x, y) for _ in range(STEPS)]
    mine = {id(p) for p in trainer.held}
    held = {i: [p.data for p in unit.parameters()] for i, unit in enumerate(trainer.units.layers)
            if id(unit.parameters()[0]) in mine}
    return held, losses, mesh.coords["tensor"]


@pytest.mark.parametrize("data,tensor,context,schedule,micro_batches,world", [
    (2, 2, 1, "1f1b", 2, 8),        # data × pipeline × tensor
    (1, 2, 1, "zb-h1", 2, 4),       # tensor × ZB-H1 pipeline
    (1, 2, 2, "1f1b", 2, 8),        # pipeline × context × tensor
    (2, 1, 2, "1f1b", 2, 4),        # data × context (one pipeline rank)
])
def test_parallel_grid_data_pipeline_tensor_trains_a_gpt_like_one_process(data, tensor, context, schedule,
                                                                          micro_batches, world):
    reference_gpt, (x, y) = build(), batch()
    loss_fn, opt, expected_losses = CrossEntropyLoss(), AdamW(reference_gpt.parameters(), lr=0.01), []
    for _ in range(STEPS):
        reference_gpt.zero_grad()
        expected_losses.append(loss_fn.forward(reference_gpt.forward(x), y))
        reference_gpt.backward(loss_fn.backward())
        opt.step()
    units = reference_gpt.units()
    results = run(_train_tensor, world, data, tensor, schedule, micro_batches, context, timeout=120)
    seen = set()
    for held, _, q in results:
        for i, values in held.items():
            unit = units[i]
            want = _expected_shards(unit, tensor, q) if unit in reference_gpt.blocks else \
                [p.data for p in unit.parameters()]
            assert len(values) == len(want)
            for got, expected in zip(values, want, strict=True):
                np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-11)
            seen.add(i)
    assert seen == set(range(len(units)))
    for _, losses, _ in results:          # the global objective, on every rank
        np.testing.assert_allclose(losses, expected_losses, rtol=1e-10)


def test_parallel_grid_with_zero1_on_the_data_axis_trains_a_gpt_like_one_process():
    """dp 2 × ZB-H1 pp 2 with ZeRO-1: the two replicas' optimizers step one half each of their stage."""
    expected, expected_losses = reference()
    results = run(_train, 4, 2, "zb-h1", 4, False, 1, timeout=120)
    for params, *_ in results:
        for i, value in params.items():
            np.testing.assert_allclose(value, expected[i], rtol=1e-9, atol=1e-11)
    held = sum(value.size for params, *_ in results for value in params.values())
    assert sum(shard for *_, shard in results) == held // 2
    assert set().union(*(params for params, *_ in results)) == set(range(len(expected)))
    for _, losses, *_ in results:
        np.testing.assert_allclose(losses, expected_losses, rtol=1e-10)


def test_parallel_grid_with_bucketed_overlapped_data_parallelism_on_a_pipeline_trains_like_one_process():
    """dp 2 × 1F1B pp 2 with overlap: each stage's runner carries DataParallel's GradientSync, its 512-byte
    buckets sent during the stage's last backward."""
    expected, expected_losses = reference()
    results = run(_train, 4, 2, "1f1b", 2, True, 0, 512, timeout=120)
    for params, _, buckets, _ in results:
        assert len(buckets) == 1 and buckets[0] > 1            # one stage per rank, several buckets
        for i, value in params.items():
            np.testing.assert_allclose(value, expected[i], rtol=1e-9, atol=1e-11)
    assert set().union(*(params for params, *_ in results)) == set(range(len(expected)))
    for _, losses, *_ in results:
        np.testing.assert_allclose(losses, expected_losses, rtol=1e-10)
