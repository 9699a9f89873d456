"""Data × spatial parallelism (GridSpatial) equals one process, per parameter, after several steps (float64),
under either placement; bad grids raise clear errors."""

import numpy as np
import pytest

from minidist.cluster import LinkModel, Topology, run
from minidist.nn import Conv2d, CrossEntropyLoss, Flatten, Linear, MaxPool2d, ReLU, Sequential, Tanh
from minidist.optim import SGD
from minidist.parallel.grids import GridSpatial

IMAGE_HW, BATCH, STEPS = (8, 10), 6, 3      # a batch of 6 splits unevenly over 4 data groups


def make_model() -> Sequential:
    rng = np.random.default_rng(11)
    return Sequential(Conv2d(2, 3, 3, padding=1, rng=rng, dtype=np.float64), ReLU(),       # 8 x 10
                      MaxPool2d(2),                                                       # 4 x 5
                      Conv2d(3, 4, 3, padding=1, rng=rng, dtype=np.float64), Tanh(),      # 4 x 5
                      Flatten(), Linear(4 * 4 * 5, 3, rng=rng, dtype=np.float64))


def batch(step: int):
    rng = np.random.default_rng([12, step])
    return rng.standard_normal((BATCH, 2, *IMAGE_HW)), rng.integers(0, 3, BATCH)


def single_process():
    model = make_model()
    opt, loss_fn, losses = SGD(model.parameters(), lr=0.1, momentum=0.9), CrossEntropyLoss(), []
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        losses.append(loss_fn.forward(model.forward(x), y))
        model.backward(loss_fn.backward())
        opt.step()
    return losses, [p.data for p in model.parameters()]


def train(comm, data, spatial, placement):
    grid = GridSpatial(comm, data, spatial, placement=placement)
    model = make_model()
    net = grid.spatialize(model, IMAGE_HW)
    opt, loss_fn = SGD(model.parameters(), lr=0.1, momentum=0.9), CrossEntropyLoss()
    losses = [grid.train_step(net, loss_fn, opt, *batch(step)) for step in range(STEPS)]
    return (grid.d, grid.s), losses, [p.data for p in model.parameters()]


@pytest.mark.parametrize(
    "data, spatial, placement",
    [
        (2, (2, 1), "spatial_inside"),
        (2, (1, 2), "spatial_across"),
        (1, (2, 2), "spatial_inside"),
        (4, (1, 1), "spatial_inside"),
    ],
    ids=["2x(2x1)", "2x(1x2)-across", "1x(2x2)", "4x(1x1)"],
)
def test_data_spatial_training_equals_one_process(data, spatial, placement):
    ref_losses, ref_params = single_process()
    initial = [p.data.copy() for p in make_model().parameters()]
    results = run(train, 4, data, spatial, placement, timeout=60)
    expected = [(d, s) for d in range(data) for s in range(4 // data)]
    assert sorted(coords for coords, _, _ in results) == expected
    for rank, (coords, _, params) in enumerate(results):
        for k, (got, want, start) in enumerate(zip(params, ref_params, initial, strict=True)):
            assert not np.array_equal(want, start), "a parameter never moved: the test would be vacuous"
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13,
                                       err_msg=f"rank {rank} {coords}, param {k}")
    group_losses = {coords[0]: losses for coords, losses, _ in results}
    np.testing.assert_allclose(np.sum(list(group_losses.values()), axis=0), ref_losses, rtol=1e-12)


def test_placement_puts_spatial_groups_inside_or_across_nodes():
    def fn(comm, placement, require):
        try:
            grid = GridSpatial(comm, 2, (2, 1), placement=placement, require_spatial_in_node=require)
        except ValueError as error:
            return str(error)
        return grid.d, grid.s, grid.spatial_comm.world_size, grid.data_comm.world_size

    topo = Topology(2, 2, intra=LinkModel(), inter=LinkModel(beta=1e-9))
    assert run(fn, 4, "spatial_inside", True, link=topo) == [(r // 2, r % 2, 2, 2) for r in range(4)]
    assert run(fn, 4, "spatial_across", False, link=topo) == [(r % 2, r // 2, 2, 2) for r in range(4)]
    assert all("spans nodes" in e for e in run(fn, 4, "spatial_across", True, link=topo))


@pytest.mark.parametrize("args, message", [((2, (2, 2)), "D·Ph·Pw = world size 4"),
                                           ((3, (1, 1)), "D·Ph·Pw = world size 4"),
                                           ((2, 2), "spatial = (Ph, Pw)"), ((0, (2, 2)), "data >= 1"),
                                           ((2, (2, 1), "diagonal"), "placement must be one of")])
def test_bad_grids_raise(args, message):
    def fn(comm):
        try:
            GridSpatial(comm, *args)
        except ValueError as error:
            return str(error)
        return None

    assert all(e is not None and message in e for e in run(fn, 4))


def test_bad_batches_raise():
    def attempt(call):
        try:
            call()
        except ValueError as error:
            return str(error)
        return None

    def fn(comm):
        grid = GridSpatial(comm, 2, (1, 1))
        before = attempt(lambda: grid.block(np.zeros((4, 2, *IMAGE_HW))))     # spatialize not called yet
        grid.spatialize(make_model(), IMAGE_HW)
        return [before, attempt(lambda: grid.block(np.zeros((4, 2, 8, 9)))),
                attempt(lambda: grid.block(np.zeros((1, 2, *IMAGE_HW))))]

    for errors in run(fn, 2):
        assert "input_hw" in errors[0] and "(8, 10)" in errors[1] and "cannot feed 2" in errors[2]
