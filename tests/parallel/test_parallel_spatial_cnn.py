"""A small CNN trained spatially parallel on the cluster equals the same CNN trained in one process."""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.collectives import sum_partial_gradients
from minidist.nn import AvgPool2d, Conv2d, CrossEntropyLoss, Flatten, Linear, MaxPool2d, ReLU, Sequential
from minidist.optim import SGD
from minidist.parallel.spatial import GridAllgather, SpatialConv2d, grid_blocks, spatialize

IMAGE_HW = (18, 22)   # divides evenly by none of the grids below
STEPS = 4


def make_model(seed: int) -> Sequential:
    rng = np.random.default_rng(seed)
    return Sequential(
        Conv2d(2, 4, 3, padding=1, rng=rng, dtype=np.float64), ReLU(),   # 18 x 22
        MaxPool2d(2),                                                    # 9 x 11
        Conv2d(4, 5, 5, padding=2, rng=rng, dtype=np.float64), ReLU(),   # 9 x 11, halo of 2
        AvgPool2d(3, stride=2, padding=1),                               # 5 x 6
        Flatten(), Linear(5 * 5 * 6, 3, rng=rng, dtype=np.float64),
    )


def batch(step: int):
    rng = np.random.default_rng(100 + step)
    return rng.standard_normal((4, 2, *IMAGE_HW)), rng.integers(0, 3, size=4)


def train(model, forward_input, steps=STEPS):
    """SGD with momentum; forward_input(x) gives what the model's forward takes (the rank's block)."""
    optimizer, loss_fn, losses = SGD(model.parameters(), lr=0.1, momentum=0.9), CrossEntropyLoss(), []
    for step in range(steps):
        x, labels = batch(step)
        optimizer.zero_grad()
        losses.append(loss_fn.forward(model.forward(forward_input(x)), labels))
        model.backward(loss_fn.backward())
        sum_partial_gradients(model.parameters(), algorithm="ring")   # the convs': summed over the blocks
        optimizer.step()
    return losses


def worker(comm, grid):
    model = make_model(seed=7)                       # the same initial weights on every rank
    parallel = spatialize(model, comm, grid, IMAGE_HW)
    assert isinstance(parallel[0], SpatialConv2d) and any(isinstance(m, GridAllgather) for m in parallel)
    assert [id(p) for p in parallel.parameters()] == [id(p) for p in model.parameters()]
    rows, cols = grid_blocks(IMAGE_HW, grid)[comm.rank]
    losses = train(parallel, lambda x: np.ascontiguousarray(x[:, :, rows, cols]))
    return losses, model.state_dict()


@pytest.mark.exercise("halo_exchange")
@pytest.mark.slow
@pytest.mark.parametrize("grid", [(3, 1), (2, 3)], ids=["3x1", "2x3"])
def test_parallel_spatial_cnn_training_equals_single_process(grid):
    reference = make_model(seed=7)
    initial = reference.state_dict()
    reference_losses = train(reference, lambda x: x)
    per_rank = run(worker, grid[0] * grid[1], grid, timeout=60)
    for rank, (losses, state) in enumerate(per_rank):
        np.testing.assert_allclose(losses, reference_losses, rtol=1e-10)
        for name, value in reference.state_dict().items():
            assert not np.array_equal(value, initial[name]), f"{name} never moved: the test would be vacuous"
            np.testing.assert_allclose(state[name], value, rtol=1e-10, atol=1e-12 * np.abs(value).max(),
                                       err_msg=f"parameter {name}, rank {rank}, grid {grid}")


def accumulate_worker(comm):
    conv = Conv2d(2, 3, 3, stride=2, padding=1, rng=np.random.default_rng(3), dtype=np.float64)
    layer = SpatialConv2d(conv, comm, (2, 1), (9, 7))
    rows, cols = grid_blocks((9, 7), (2, 1))[comm.rank]
    x = np.random.default_rng(4).standard_normal((2, 2, 9, 7))
    for _ in range(2):                                # two backward passes without zero_grad
        y = layer.forward(np.ascontiguousarray(x[:, :, rows, cols]))
        layer.backward(np.ones_like(y))
    sum_partial_gradients(conv.parameters(), algorithm="ring")    # once, after both passes
    return [p.grad for p in conv.parameters()]


@pytest.mark.exercise("halo_exchange")
def test_parallel_spatial_conv_backward_accumulates_like_module_backward():
    conv = Conv2d(2, 3, 3, stride=2, padding=1, rng=np.random.default_rng(3), dtype=np.float64)
    x = np.random.default_rng(4).standard_normal((2, 2, 9, 7))
    for _ in range(2):
        conv.backward(np.ones_like(conv.forward(x)))
    for grads in run(accumulate_worker, 2):
        for got, p in zip(grads, conv.parameters(), strict=True):
            np.testing.assert_allclose(got, p.grad, rtol=1e-10)
