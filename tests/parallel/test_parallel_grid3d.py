"""3-D parallelism (data × pipeline × tensor) equals one process, per parameter, after several steps."""

import numpy as np
import pytest

from minidist.cluster import LinkModel, Topology, run
from minidist.nn import Linear, MSELoss, ReLU, Sequential, Tanh
from minidist.optim import SGD
from minidist.parallel.grid3d import Grid3D

STEPS, BATCH = 3, 10


def make_blocks():
    rng = np.random.default_rng(1)
    dims = [(6, 8, 5), (5, 8, 4)]
    return [
        (
            Linear(a, h, rng=rng, dtype=np.float64),
            Tanh() if i else ReLU(),
            Linear(h, b, rng=rng, dtype=np.float64),
        )
        for i, (a, h, b) in enumerate(dims)
    ]


def data():
    rng = np.random.default_rng(2)
    return rng.standard_normal((BATCH, 6)), rng.standard_normal((BATCH, 4))


def reference():
    model = Sequential(*[layer for block in make_blocks() for layer in block])
    opt, loss_fn = SGD(model.parameters(), lr=0.1), MSELoss()
    x, y = data()
    for _ in range(STEPS):
        opt.zero_grad()
        loss_fn.forward(model.forward(x), y)
        model.backward(loss_fn.backward())
        opt.step()
    return [layer for layer in model if isinstance(layer, Linear)]


def train(comm, d, p, t):
    grid = Grid3D(comm, d, p, t)
    stage = grid.stage(make_blocks())
    opt, loss_fn = SGD(stage.parameters(), lr=0.1), MSELoss()
    x, y = data()
    for _ in range(STEPS):
        grid.train_step(stage, loss_fn, opt, x, y)
    linears = [layer for layer in stage if hasattr(layer, "weight")]
    return grid.p, [(type(l).__name__, getattr(l, "rows", getattr(l, "cols", None)), l.weight.data,
                     l.bias.data) for l in linears]


@pytest.mark.parametrize("d, p, t", [(2, 2, 1), (1, 2, 2), (2, 1, 2)])
def test_grid_training_equals_one_process(d, p, t):
    ref = reference()
    for stage_index, layers in run(train, d * p * t, d, p, t):
        first = 2 * (stage_index if p > 1 else 0)
        for k, (kind, part, w, b) in enumerate(layers):
            full = ref[first + k]
            if kind == "ColumnParallelLinear":
                np.testing.assert_allclose(w, full.weight.data[part], rtol=1e-12, atol=1e-14)
                np.testing.assert_allclose(b, full.bias.data[part], rtol=1e-12, atol=1e-14)
            else:
                np.testing.assert_allclose(w, full.weight.data[:, part], rtol=1e-12, atol=1e-14)
                np.testing.assert_allclose(b, full.bias.data, rtol=1e-12, atol=1e-14)


def test_placement_and_errors():
    def fn(comm, placement, require):
        try:
            grid = Grid3D(comm, 2, 2, 2, placement=placement, require_tensor_in_node=require)
        except ValueError as error:
            return str(error)
        return [grid.comm.rank, (grid.d, grid.p, grid.t)]
    topo = Topology(2, 4, intra=LinkModel(), inter=LinkModel(beta=1e-9))
    inside = run(fn, 8, "tensor_inside", True, link=topo)
    assert [c for _, c in inside] == [(r // 4, r // 2 % 2, r % 2) for r in range(8)]
    across = run(fn, 8, "tensor_across", True, link=topo)
    assert all("spans nodes" in e for e in across)
    assert all("D·P·T = world size 8" in e for e in run(lambda c: fn_bad(c), 8))


def fn_bad(comm):
    try:
        Grid3D(comm, 2, 2, 3)
    except ValueError as error:
        return str(error)


def train_micro(comm, schedule):
    grid = Grid3D(comm, 2, 2, 1)
    stage = grid.stage(make_blocks(), num_micro_batches=2, schedule=schedule)
    opt, loss_fn = SGD(stage.parameters(), lr=0.1), MSELoss()
    x, y = data()
    losses = [grid.train_step(stage, loss_fn, opt, x, y) for _ in range(STEPS)]
    return grid.p, [(l.weight.data, l.bias.data) for l in stage if hasattr(l, "weight")], losses


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_grid_with_micro_batches_equals_one_process(schedule):
    """The pipeline of the grid is pipeline/'s Pipeline: any schedule, M micro-batches per data group."""
    ref = reference()
    results = run(train_micro, 4, schedule)
    for stage_index, layers, _ in results:
        for k, (w, b) in enumerate(layers):
            full = ref[2 * stage_index + k]
            np.testing.assert_allclose(w, full.weight.data, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(b, full.bias.data, rtol=1e-12, atol=1e-14)
    x, y = data()
    first = Sequential(*[layer for block in make_blocks() for layer in block])
    whole = MSELoss().forward(first.forward(x), y)          # the first step's loss, before any update
    assert np.isclose(sum(losses[0] for p, _, losses in results if p == 1), whole, rtol=1e-12)


def test_train_step_needs_the_grids_stage():
    def fn(comm):
        grid = Grid3D(comm, 1, 1, 1)
        other = Sequential(Linear(6, 4))
        try:
            grid.train_step(other, MSELoss(), SGD(other.parameters(), lr=0.1), *data())
        except ValueError as error:
            return str(error)
    assert "grid.stage(blocks)" in run(fn, 1)[0]
