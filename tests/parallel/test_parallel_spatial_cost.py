"""The clock rehearsal of a spatial conv costs what the real layer costs; the 1-D formula agrees."""

import numpy as np
import pytest

from minidist.cluster import Device, LinkModel, run
from minidist.collectives import sum_partial_gradients
from minidist.nn import Conv2d
from minidist.parallel.spatial import SpatialConv2d, grid_blocks
from minidist.parallel.spatial.cost import forward_time_1d, rehearse_conv_step

SIZE, BATCH, CHANNELS = (13, 11), 2, 3


def real_and_rehearsed(comm, grid):
    conv = Conv2d(CHANNELS, CHANNELS, 3, padding=1, rng=np.random.default_rng(0), dtype=np.float64)
    layer = SpatialConv2d(conv, comm, grid, SIZE)
    rows, cols = grid_blocks(SIZE, grid)[comm.rank]
    x = np.random.default_rng(1).standard_normal((BATCH, CHANNELS, *SIZE))
    start = comm.clock
    y = layer.forward(np.ascontiguousarray(x[:, :, rows, cols]))
    middle = comm.clock
    layer.backward(np.ones_like(y))
    sum_partial_gradients(layer.parameters(), algorithm="ring")   # the weight gradient over the grid
    real = (middle - start, comm.clock - middle)
    comm.barrier()
    return real, rehearse_conv_step(comm, layer.plan, BATCH, CHANNELS, CHANNELS, dtype=np.float64)


@pytest.mark.exercise("halo_exchange")
@pytest.mark.parametrize("grid", [(3, 1), (2, 2)], ids=["3x1", "2x2"])
def test_parallel_spatial_rehearsal_costs_what_the_real_layer_costs(grid):
    results = run(real_and_rehearsed, grid[0] * grid[1], grid)
    for rank, (real, rehearsed) in enumerate(results):
        assert real[0] > 0 and real[1] > real[0]   # backward: twice the FLOPs plus the allreduce
        np.testing.assert_allclose(real, rehearsed, rtol=1e-12, err_msg=f"rank {rank}")
    if grid[1] == 1:
        link, device = LinkModel(), Device()
        formula = forward_time_1d(SIZE[0], SIZE[1], 3, grid[0], BATCH, CHANNELS, link.alpha, link.beta,
                                  device.flops, itemsize=8)
        # the formula counts the widest strip (5 rows), in-image output rows all equal in width
        assert max(real[0] for real, _ in results) == pytest.approx(formula, rel=1e-12)


def test_parallel_spatial_forward_formula_rejects_strips_thinner_than_the_halo():
    with pytest.raises(ValueError, match="thinner than the halo"):
        forward_time_1d(8, 8, 5, 8, 1, 1, 5e-6, 4e-11, 1e12)
    with pytest.raises(ValueError, match="odd kernel"):
        forward_time_1d(8, 8, 2, 2, 1, 1, 5e-6, 4e-11, 1e12)
