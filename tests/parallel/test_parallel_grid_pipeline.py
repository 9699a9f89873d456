"""Data × pipeline grids (minidist/parallel/grid_pipeline.py) train a tiny GPT like one process.

A float64 GPT (vocabulary 11, 8 positions, 2 blocks, d = 8, 2 heads) pipelined as its units, trained 3 AdamW
steps by D data replicas of a P-rank pipeline under 1F1B, ZB-H1, interleaved (v = 2) and Chimera; every
parameter and each step's loss must equal one process's."""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import GPT, CrossEntropyLoss
from minidist.optim import AdamW
from minidist.parallel.grid_pipeline import DataPipelineGrid, gpt_units
from minidist.parallel.pipeline.chimera import chimera_schedule
from minidist.parallel.pipeline.interleaved import interleaved_schedule
from minidist.parallel.pipeline.schedule import one_f_one_b_schedule
from minidist.parallel.pipeline.tasks import from_ops
from minidist.parallel.pipeline.zero_bubble import zero_bubble_schedule

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
    "dp2 x 1f1b pp2": (2, from_ops(one_f_one_b_schedule(2, 2)), 2, 2, 4),
    "dp2 x zb-h1 pp2": (2, zero_bubble_schedule(2, 2), 2, 2, 4),
    "dp2 x interleaved pp2 v2": (2, interleaved_schedule(2, 2, 2), 4, 2, 4),
    "dp1 x chimera pp4": (1, chimera_schedule(4, 4), 4, 4, 4),
    "dp2 x chimera pp4": (2, chimera_schedule(4, 4), 4, 4, 8),
}


@pytest.mark.parametrize("name", list(CASES))
def test_parallel_grid_data_pipeline_trains_a_gpt_like_one_process(name):
    data, schedule, stages, micro_batches, world = CASES[name]
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
                         schedule=from_ops(one_f_one_b_schedule(1, 1)), num_stages=1, num_micro_batches=1, data=3)

    with pytest.raises(Exception, match="must be an integer >= 1 dividing world_size 2"):
        run(bad_data, 2)
    with pytest.raises(ValueError, match="untied"):
        gpt_units(GPT(V, T, 1, 8, 2, tie_weights=True, rng=np.random.default_rng(0)))
