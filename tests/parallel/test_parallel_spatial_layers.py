"""Spatially split Conv2d / MaxPool2d / AvgPool2d on the cluster against the single-process layers.

Many cases share one cluster run (starting processes is the expensive part): the workers build every
case's layer from the same seed, scatter the input to the grid, run forward and backward, gather the
output and the input gradient, and send everything back; the parent compares with the single-process
layer (float64, rtol 1e-10; an atol of 1e-12 of the array's scale covers entries that cancel to ~0).
"""

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from minidist.cluster import ClusterError, run
from minidist.collectives import sum_partial_gradients
from minidist.nn import AvgPool2d, Conv2d, MaxPool2d
from minidist.parallel.spatial import (
    SpatialAvgPool2d,
    SpatialConv2d,
    SpatialMaxPool2d,
    gather_from_grid,
    scatter_to_grid,
)
from minidist.parallel.spatial.comm import exchange_halo, return_halo_gradient
from minidist.parallel.spatial.partition import HaloPlan

GRIDS = [(1, 1), (2, 1), (3, 1), (4, 1), (1, 2), (2, 2), (1, 3), (2, 3)]
EXERCISE = pytest.mark.exercise("halo_exchange")  # on every test that runs the forward halo exchange


def make_layer(case):
    kind, channels = case["kind"], case["channels"]
    kernel, stride, padding = case["kernel"], case["stride"], case["padding"]
    if kind == "conv":
        return Conv2d(channels, channels + 1, kernel, stride, padding,
                      rng=np.random.default_rng(case["seed"]), dtype=np.float64)
    return (MaxPool2d if kind == "max" else AvgPool2d)(kernel, stride, padding)


def make_data(case):
    rng = np.random.default_rng(case["seed"] + 1)
    x = rng.standard_normal((case["batch"], case["channels"], *case["hw"]))
    if case["kind"] == "max":  # ties would make the argmax (and so the gradient) depend on rounding
        x = rng.permutation(x.size).reshape(x.shape) / x.size
    layer = make_layer(case)
    dy = rng.standard_normal(layer.output_shape(x.shape))
    return x, dy


SPATIAL = {"conv": SpatialConv2d, "max": SpatialMaxPool2d, "avg": SpatialAvgPool2d}


def worker(comm, grid, cases):
    """Run every case on this rank; return what the parent checks."""
    results = []
    for case in cases:
        x, dy = make_data(case)
        layer = make_layer(case)
        spatial = SPATIAL[case["kind"]](layer, comm, grid, case["hw"])
        x_local = scatter_to_grid(comm, x if comm.rank == 0 else None, grid)
        before = (comm.stats.bytes_sent, comm.stats.bytes_received, comm.stats.messages_sent,
                  comm.stats.messages_received)
        y_local = spatial.forward(x_local)
        after = (comm.stats.bytes_sent, comm.stats.bytes_received, comm.stats.messages_sent,
                 comm.stats.messages_received)
        (r0, r1), (c0, c1) = spatial.plan.out_block(comm.rank)
        dx_local = spatial.backward(np.ascontiguousarray(dy[:, :, r0:r1, c0:c1]))
        sum_partial_gradients(layer.parameters(), algorithm="ring")   # a conv's: summed over the blocks
        results.append({
            "y": gather_from_grid(comm, y_local, grid), "dx": gather_from_grid(comm, dx_local, grid),
            "grads": [p.grad.copy() for p in layer.parameters()],
            "forward_traffic": tuple(b - a for a, b in zip(before, after, strict=True)),
        })
    return results


def check_cases(grid, cases):
    per_rank = run(worker, grid[0] * grid[1], grid, cases, timeout=60)
    for index, case in enumerate(cases):
        x, dy = make_data(case)
        layer = make_layer(case)
        y = layer.forward(x)
        dx = layer.backward(dy)
        where = f"case {case} on grid {grid}"
        got = per_rank[0][index]
        np.testing.assert_allclose(got["y"], y, rtol=1e-10, atol=1e-12 * np.abs(y).max(), err_msg=where)
        np.testing.assert_allclose(got["dx"], dx, rtol=1e-10, atol=1e-12 * np.abs(dx).max(), err_msg=where)
        plan = HaloPlan.build(case["hw"], case["kernel"], case["stride"], case["padding"], grid)
        for rank, results in enumerate(per_rank):
            for p, g in zip(layer.parameters(), results[index]["grads"], strict=True):  # after the allreduce
                np.testing.assert_allclose(g, p.grad, rtol=1e-10, atol=1e-12 * np.abs(p.grad).max(),
                                           err_msg=f"{where}, rank {rank}")
            sent, received = plan.halo_bytes(rank, case["batch"], case["channels"], itemsize=8)
            assert results[index]["forward_traffic"] == (sent, received, *plan.messages(rank)), where


def case_grid(kind, kernel, stride, padding, grid, extra_h, extra_w, channels=2, batch=2, seed=0):
    """A case whose image gives every rank at least one output row and column (plus extra)."""
    hw = tuple(max(1, k - 2 * padding, (parts - 1) * stride + k - 2 * padding) + extra
               for parts, k, extra in zip(grid, (kernel, kernel), (extra_h, extra_w), strict=True))
    return {"kind": kind, "kernel": kernel, "stride": stride, "padding": padding, "hw": hw,
            "channels": channels, "batch": batch, "seed": seed}


@EXERCISE
@pytest.mark.slow
@pytest.mark.parametrize("grid", GRIDS, ids=[f"{h}x{w}" for h, w in GRIDS])
def test_parallel_spatial_layers_match_single_process_over_kernels_strides_paddings(grid):
    """Kernels 1..5 × strides 1..3 × paddings 0..2 (45 combinations), each on two of the eight grids,
    for conv and both pools, at sizes that rarely divide evenly."""
    cases, which = [], GRIDS.index(grid) % 4
    for combination, (kernel, stride, padding) in enumerate(
            (k, s, p) for k in range(1, 6) for s in range(1, 4) for p in range(3)):
        if combination % 4 != which:
            continue
        kinds = ["conv"] + (["max", "avg"] if 2 * padding <= kernel else [])
        kind = kinds[(combination // 4 + GRIDS.index(grid) // 4) % len(kinds)]
        cases.append(case_grid(kind, kernel, stride, padding, grid, extra_h=(kernel * stride) % 4,
                               extra_w=(kernel + padding) % 3, channels=1 + kernel % 2,
                               batch=1 + stride % 2, seed=combination))
    check_cases(grid, cases)


@st.composite
def grid_and_cases(draw):
    grid = draw(st.sampled_from(GRIDS))
    cases = []
    for seed in range(draw(st.integers(2, 4))):
        kernel, stride, padding = draw(st.integers(1, 5)), draw(st.integers(1, 3)), draw(st.integers(0, 2))
        kinds = ["conv"] + (["max", "avg"] if 2 * padding <= kernel else [])
        cases.append(case_grid(draw(st.sampled_from(kinds)), kernel, stride, padding, grid,
                               draw(st.integers(0, 9)), draw(st.integers(0, 9)), draw(st.integers(1, 3)),
                               draw(st.integers(1, 2)), seed))
    return grid, cases


@EXERCISE
@settings(max_examples=5, phases=[Phase.explicit, Phase.reuse, Phase.generate])  # no shrinking:
@given(grid_and_cases())                                                       # each try starts processes
def test_parallel_spatial_layers_match_single_process_hypothesis(grid_cases):
    check_cases(*grid_cases)


def window_worker(comm, grid, image, kernel, stride, padding):
    plan = HaloPlan.build(image.shape[2:], kernel, stride, padding, grid)
    (r0, r1), (c0, c1) = plan.own_block(comm.rank)
    window = exchange_halo(comm, np.ascontiguousarray(image[:, :, r0:r1, c0:c1]), plan)
    return window, (comm.stats.messages_sent, comm.stats.bytes_sent)


@EXERCISE
@pytest.mark.parametrize("grid, kernel, stride, padding, hw", [
    ((3, 3), 3, 1, 1, (9, 10)),      # the 2-D case: corners arrive through the side neighbours
    ((2, 3), 5, 2, 2, (11, 13)),     # asymmetric halos
    ((5, 1), 5, 1, 2, (6, 4)),       # multi-hop: halo of 2 rows past pieces of 1 row
    ((2, 2), 1, 1, 0, (5, 7)),       # kernel 1: nothing moves
])
def test_parallel_spatial_exchange_halo_returns_exactly_the_window(grid, kernel, stride, padding, hw):
    image = np.arange(2 * 3 * hw[0] * hw[1], dtype=np.float64).reshape(2, 3, *hw)
    plan = HaloPlan.build(hw, kernel, stride, padding, grid)
    results = run(window_worker, plan.world_size, grid, image, kernel, stride, padding, timeout=60)
    for rank, (window, (messages, nbytes)) in enumerate(results):
        (r0, r1), (c0, c1) = plan.window_block(rank)
        np.testing.assert_array_equal(window, image[:, :, r0:r1, c0:c1])
        assert (messages, nbytes) == (plan.messages(rank)[0], plan.halo_bytes(rank, 2, 3, 8)[0])
    if grid == (3, 3):
        assert plan.messages(4) == (4, 4)  # the centre rank: 4 messages each way, not 8
    if kernel == 1:
        assert all(nbytes == 0 for _, (_, nbytes) in results)


def bad_window_worker(comm, grid):
    plan = HaloPlan.build((8, 8), 3, 1, 1, grid)
    (r0, r1), (c0, c1) = plan.window_block(comm.rank)
    rows = r1 - r0 + (1 if comm.rank == 1 else 0)   # rank 1 brings one row too many; the others wait for it
    return return_halo_gradient(comm, np.zeros((1, 1, rows, c1 - c0)), plan)


def test_parallel_spatial_wrong_block_fails_promptly_naming_the_shape():
    with pytest.raises(ClusterError, match="expected spatial shape"):
        run(bad_window_worker, 4, (2, 2), timeout=30)


def test_parallel_spatial_layer_rejects_bad_configurations():
    comm = SimpleNamespace(rank=0, world_size=4)   # construction only plans; it sends nothing
    conv = Conv2d(1, 1, 3, rng=np.random.default_rng(0), dtype=np.float64)
    with pytest.raises(ValueError, match="only 2 rows"):
        SpatialConv2d(conv, comm, (4, 1), (4, 9))        # 4 ranks, 2 output rows
    with pytest.raises(ValueError, match="world_size 4"):
        SpatialConv2d(conv, comm, (2, 1), (9, 9))
    with pytest.raises(TypeError, match="wraps a Conv2d"):
        SpatialConv2d(MaxPool2d(2), comm, (4, 1), (9, 9))
    with pytest.raises(ValueError, match="only 3 columns"):
        SpatialMaxPool2d(MaxPool2d(2), comm, (1, 4), (9, 7))  # 7 // 2 = 3 output columns for 4 ranks
