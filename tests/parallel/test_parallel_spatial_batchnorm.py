"""A CNN with BatchNorm2d trained spatially parallel equals the same CNN in one process (issue 21).

spatialize maps BatchNorm2d to SpatialBatchNorm2d, whose statistics span every rank's block of H×W;
per parameter and per running statistic, float64, after several steps, for every allreduce algorithm.
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.collectives import ALGORITHMS, sum_partial_gradients
from minidist.nn import BatchNorm2d, Conv2d, CrossEntropyLoss, Flatten, Linear, MaxPool2d, ReLU, Sequential
from minidist.optim import SGD
from minidist.parallel.spatial import SpatialBatchNorm2d, grid_blocks, spatialize

IMAGE_HW = (10, 7)     # divides evenly by none of the grids below
STEPS = 3


def make_model(seed: int = 3) -> Sequential:
    rng = np.random.default_rng(seed)
    return Sequential(
        Conv2d(2, 3, 3, padding=1, rng=rng, dtype=np.float64), BatchNorm2d(3, momentum=0.2, dtype=np.float64),
        ReLU(), MaxPool2d(2),                                              # 5 x 3
        Conv2d(3, 4, 3, padding=1, rng=rng, dtype=np.float64), BatchNorm2d(4, dtype=np.float64), ReLU(),
        Flatten(), Linear(4 * 5 * 3, 3, rng=rng, dtype=np.float64),
    )


def batch(step: int):
    rng = np.random.default_rng(50 + step)
    return 2.0 + rng.standard_normal((3, 2, *IMAGE_HW)), rng.integers(0, 3, size=3)


def train(model, forward_input):
    optimizer, loss_fn, losses = SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), []
    for step in range(STEPS):
        x, labels = batch(step)
        optimizer.zero_grad()
        losses.append(loss_fn.forward(model.forward(forward_input(x)), labels))
        model.backward(loss_fn.backward())
        sum_partial_gradients(model.parameters(), algorithm="ring")   # the convs': summed over the blocks
        optimizer.step()
    return losses


def worker(comm, grid, algorithm):
    model = make_model()
    parallel = spatialize(model, comm, grid, IMAGE_HW)
    norms = [m for m in parallel if isinstance(m, SpatialBatchNorm2d)]
    assert len(norms) == 2
    for norm in norms:
        norm.algorithm = algorithm
    assert [id(p) for p in parallel.parameters()] == [id(p) for p in model.parameters()]
    rows, cols = grid_blocks(IMAGE_HW, grid)[comm.rank]
    losses = train(parallel, lambda x: np.ascontiguousarray(x[:, :, rows, cols]))
    return losses, model.state_dict()


@pytest.mark.parametrize("grid, algorithm", [((2, 1), "ring"), ((1, 3), "tree"), ((2, 2), "naive"),
                                             ((3, 1), "parameter_server"), ((2, 2), "recursive_doubling"),
                                             ((1, 2), "rabenseifner"), ((3, 1), "double_tree")])
def test_spatial_batchnorm_training_equals_single_process(grid, algorithm):
    assert algorithm in ALGORITHMS
    reference = make_model()
    initial = reference.state_dict()
    reference_losses = train(reference, lambda x: x)
    for rank, (losses, state) in enumerate(run(worker, grid[0] * grid[1], grid, algorithm, timeout=60)):
        np.testing.assert_allclose(losses, reference_losses, rtol=1e-9)
        for name, value in reference.state_dict().items():
            assert not np.array_equal(value, initial[name]), f"{name} never moved"
            np.testing.assert_allclose(state[name], value, rtol=1e-9, atol=1e-12,
                                       err_msg=f"{name}, rank {rank}, grid {grid}, {algorithm}")


def test_every_algorithm_is_covered():
    covered = {"ring", "tree", "naive", "parameter_server", "recursive_doubling", "rabenseifner",
               "double_tree"}
    assert covered == set(ALGORITHMS)


def test_spatial_batchnorm_refuses_other_layers():
    with pytest.raises(TypeError, match="wraps a BatchNorm2d"):
        SpatialBatchNorm2d(Conv2d(1, 1, 1, rng=np.random.default_rng(0)), comm=None)
