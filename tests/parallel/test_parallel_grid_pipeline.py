"""Data × pipeline × context × tensor grids (minidist/parallel/grid_pipeline.py) train a tiny GPT like one
process.

A float64 GPT (vocabulary 11, 8 positions, 2 blocks, d = 8, 2 heads) pipelined as its units, trained 3 AdamW
steps by D data replicas of a P-rank pipeline under 1F1B, ZB-H1, interleaved (v = 2) and Chimera, and with
tensor-parallel blocks (t = 2) and ring attention over a context group (c = 2); every parameter (shard) and
each step's loss must equal one process's."""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import GPT, CrossEntropyLoss
from minidist.optim import AdamW
from minidist.parallel.grid_pipeline import DataPipelineGrid, gpt_units, tensor_gpt_units
from minidist.parallel.pipeline.chimera import chimera_schedule
from minidist.parallel.pipeline.interleaved import interleaved_schedule
from minidist.parallel.pipeline.schedule import one_f_one_b_schedule
from minidist.parallel.pipeline.tasks import from_ops
from minidist.parallel.pipeline.zero_bubble import zero_bubble_schedule
from minidist.parallel.tensor import feature_slice

STEPS, N, T, V = 3, 8, 8, 11


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


def _train(comm, data, schedule, stages, micro_batches):
    gpt, (x, y) = build(), batch()
    grid = DataPipelineGrid(comm, gpt_units(gpt), loss_fn=CrossEntropyLoss(), schedule=schedule,
                            num_stages=stages, num_micro_batches=micro_batches, data=data)
    opt = AdamW(grid.parameters(), lr=0.01)
    losses = [grid.train_step(x, y, opt) for _ in range(STEPS)]
    mine = {id(p) for p in grid.parameters()}
    return {i: p.data for i, p in enumerate(gpt.parameters()) if id(p) in mine}, losses


CASES = {
    "dp2 x 1f1b pp2": (2, lambda: from_ops(one_f_one_b_schedule(2, 2)), 2, 2, 4),
    "dp2 x zb-h1 pp2": (2, lambda: zero_bubble_schedule(2, 2), 2, 2, 4),
    "dp2 x interleaved pp2 v2": (2, lambda: interleaved_schedule(2, 2, 2), 4, 2, 4),
    "dp1 x chimera pp4": (1, lambda: chimera_schedule(4, 4), 4, 4, 4),
    "dp2 x chimera pp4": (2, lambda: chimera_schedule(4, 4), 4, 4, 8),
}


@pytest.mark.parametrize("name", list(CASES))
def test_parallel_grid_data_pipeline_trains_a_gpt_like_one_process(name):
    data, make_schedule, stages, micro_batches, world = CASES[name]
    schedule = make_schedule()
    expected, expected_losses = reference()
    results = run(_train, world, data, schedule, stages, micro_batches, timeout=120)
    seen = set()
    for params, _ in results:
        for i, value in params.items():
            np.testing.assert_allclose(value, expected[i], rtol=1e-9, atol=1e-11)
            seen.add(i)
    assert seen == set(range(len(expected)))
    for step in range(STEPS):
        assert sum(losses[step] for _, losses in results if losses[step] is not None) == \
            pytest.approx(expected_losses[step], rel=1e-10)


def test_parallel_grid_data_pipeline_refuses_bad_sizes():
    def bad_data(comm):
        DataPipelineGrid(comm, gpt_units(build()), loss_fn=CrossEntropyLoss(),
                         schedule=from_ops(one_f_one_b_schedule(1, 1)), num_stages=1, num_micro_batches=1,
                         data=3)

    with pytest.raises(Exception, match="must be an integer >= 1 dividing world_size 2"):
        run(bad_data, 2)
    with pytest.raises(ValueError, match="untied"):
        gpt_units(GPT(V, T, 1, 8, 2, tie_weights=True, rng=np.random.default_rng(0)))


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


def _train_tensor(comm, data, tensor, schedule, stages, micro_batches, context=1):
    gpt, (x, y) = build(), batch()
    grid = DataPipelineGrid(comm, lambda *groups: tensor_gpt_units(*groups[:1], gpt, *groups[1:], seq_len=T),
                            loss_fn=CrossEntropyLoss(), schedule=schedule, num_stages=stages,
                            num_micro_batches=micro_batches, data=data, tensor=tensor, context=context,
                            seq_len=T)
    opt = AdamW(grid.parameters(), lr=0.01)
    losses = [grid.train_step(x, y, opt) for _ in range(STEPS)]
    mine = {id(p) for p in grid.parameters()}
    held = {i: [p.data for p in unit.parameters()] for i, unit in enumerate(grid.model.layers)
            if id(unit.parameters()[0]) in mine}
    return held, losses, grid.tensor_rank


@pytest.mark.parametrize("data,tensor,context,schedule,stages,micro_batches", [
    (2, 2, 1, from_ops(one_f_one_b_schedule(2, 2)), 2, 2),       # 8 ranks: data × pipeline × tensor
    (1, 2, 1, zero_bubble_schedule(2, 2), 2, 2),                  # 4 ranks: tensor × ZB-H1 pipeline
    (1, 2, 2, from_ops(one_f_one_b_schedule(2, 2)), 2, 2),       # 8 ranks: pipeline × context × tensor
    (2, 1, 2, from_ops(one_f_one_b_schedule(1, 2)), 1, 2),       # 4 ranks: data × context
])
def test_parallel_grid_data_pipeline_tensor_trains_a_gpt_like_one_process(data, tensor, context, schedule,
                                                                          stages, micro_batches):
    reference_gpt, (x, y) = build(), batch()
    loss_fn, opt, expected_losses = CrossEntropyLoss(), AdamW(reference_gpt.parameters(), lr=0.01), []
    for _ in range(STEPS):
        reference_gpt.zero_grad()
        expected_losses.append(loss_fn.forward(reference_gpt.forward(x), y))
        reference_gpt.backward(loss_fn.backward())
        opt.step()
    units = gpt_units(reference_gpt).layers
    world = data * tensor * context * (1 + max(t.rank for tick in schedule for t in tick))
    results = run(_train_tensor, world, data, tensor, schedule, stages, micro_batches, context, timeout=120)
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
    for step in range(STEPS):      # tensor ranks of the last stage report the same share: count one (q = 0)
        total = sum(losses[step] for _, losses, q in results if losses[step] is not None and q == 0)
        assert total == pytest.approx(expected_losses[step], rel=1e-10)


def _train_zero1(comm):
    gpt, (x, y) = build(), batch()
    grid = DataPipelineGrid(comm, gpt_units(gpt), loss_fn=CrossEntropyLoss(),
                            schedule=zero_bubble_schedule(2, 4), num_stages=2, num_micro_batches=4, data=2,
                            zero1=True)
    opt = grid.build_optimizer(lambda params: AdamW(params, lr=0.01))
    losses = [grid.train_step(x, y, opt) for _ in range(STEPS)]
    mine = {id(p) for p in grid.parameters()}
    shard = sum(p.size for p in opt.params)
    return {i: p.data for i, p in enumerate(gpt.parameters()) if id(p) in mine}, losses, shard


def test_parallel_grid_with_zero1_on_the_data_axis_trains_a_gpt_like_one_process():
    """dp 2 × ZB-H1 pp 2 with ZeRO-1: the two replicas' optimizers step one half each of their stage."""
    expected, expected_losses = reference()
    results = run(_train_zero1, 4, timeout=120)
    for params, _, _ in results:
        for i, value in params.items():
            np.testing.assert_allclose(value, expected[i], rtol=1e-9, atol=1e-11)
    held = sum(value.size for params, *_ in results for value in params.values())
    assert sum(shard for *_, shard in results) == held // 2
    assert set().union(*(params for params, *_ in results)) == set(range(len(expected)))
    for step in range(STEPS):
        assert sum(losses[step] for _, losses, _ in results if losses[step] is not None) == \
            pytest.approx(expected_losses[step], rel=1e-10)


def _train_overlap(comm):
    gpt, (x, y) = build(), batch()
    grid = DataPipelineGrid(comm, gpt_units(gpt), loss_fn=CrossEntropyLoss(), schedule="1f1b", num_stages=2,
                            num_micro_batches=2, data=2, overlap=True, bucket_bytes=512)
    opt = grid.build_optimizer(lambda params: AdamW(params, lr=0.01))
    losses = [grid.train_step(x, y, opt) for _ in range(STEPS)]
    mine = {id(p) for p in grid.parameters()}
    buckets = [len(sync.buckets) for sync in grid.stage_syncs]
    return {i: p.data for i, p in enumerate(gpt.parameters()) if id(p) in mine}, losses, buckets


def test_parallel_grid_with_bucketed_overlapped_data_parallelism_on_a_pipeline_trains_like_one_process():
    """dp 2 × 1F1B pp 2 with overlap: each stage's runner carries DataParallel's GradientSync, its 512-byte
    buckets sent during the stage's last backward."""
    expected, expected_losses = reference()
    results = run(_train_overlap, 4, timeout=120)
    for params, _, buckets in results:
        assert len(buckets) == 1 and buckets[0] > 1            # one stage per rank, several buckets
        for i, value in params.items():
            np.testing.assert_allclose(value, expected[i], rtol=1e-9, atol=1e-11)
    assert set().union(*(params for params, *_ in results)) == set(range(len(expected)))
    for step in range(STEPS):
        assert sum(losses[step] for _, losses, _ in results if losses[step] is not None) == \
            pytest.approx(expected_losses[step], rel=1e-10)
