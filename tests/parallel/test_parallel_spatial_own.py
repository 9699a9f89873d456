"""halo_exchange's own tests: spatially split layers that reach no other exercise.

The pools have no weights (so no gradient allreduce, no convolution backward), and a spatial
convolution's *forward* needs only the halo exchange and the single-process forward. The property of
the exercise: each rank's window holds exactly the input rows and columns its output needs (so the split
layer's output equals the single-process output), and the forward moves exactly the bytes and messages
of the halo plan — no more.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.cluster import run
from minidist.nn import AvgPool2d, Conv2d, MaxPool2d
from minidist.parallel import (
    HaloPlan,
    SpatialAvgPool2d,
    SpatialConv2d,
    SpatialMaxPool2d,
    gather_from_grid,
    scatter_to_grid,
)
from tests.parallel.halo_diagnosis import CASES, diagnose_halo


@pytest.mark.exercise("halo_exchange")
@pytest.mark.diagnose
def test_every_window_holds_its_halo_rows_columns_and_corners_and_sends_only_those():
    for case in CASES:
        wrong = diagnose_halo(case)
        assert wrong is None, wrong

GRIDS = [(2, 1), (1, 2), (2, 2), (3, 1), (1, 3), (2, 3), (3, 3)]


def make_layer(kind, channels, kernel, stride, padding, seed):
    if kind == "conv":
        return Conv2d(channels, channels + 1, kernel, stride, padding, rng=np.random.default_rng(seed),
                      dtype=np.float64)
    return (MaxPool2d if kind == "max" else AvgPool2d)(kernel, stride, padding)


def make_input(case):
    kind, batch, channels, hw, seed = case["kind"], case["batch"], case["channels"], case["hw"], case["seed"]
    rng = np.random.default_rng(seed)
    shape = (batch, channels, *hw)
    if kind == "max":  # distinct values: the argmax, and so the gradient, has no ties
        return rng.permutation(np.prod(shape)).reshape(shape) / np.prod(shape)
    return rng.standard_normal(shape)


SPATIAL = {"conv": SpatialConv2d, "max": SpatialMaxPool2d, "avg": SpatialAvgPool2d}


def worker(comm, grid, cases):
    out = []
    for case in cases:
        x = make_input(case)
        layer = make_layer(case["kind"], case["channels"], case["kernel"], case["stride"], case["padding"],
                           case["seed"])
        spatial = SPATIAL[case["kind"]](layer, comm, grid, case["hw"])
        x_local = scatter_to_grid(comm, x if comm.rank == 0 else None, grid)
        before = (comm.stats.bytes_sent, comm.stats.bytes_received, comm.stats.messages_sent,
                  comm.stats.messages_received)
        y_local = spatial.forward(x_local)
        after = (comm.stats.bytes_sent, comm.stats.bytes_received, comm.stats.messages_sent,
                 comm.stats.messages_received)
        result = {
            "y": gather_from_grid(comm, y_local, grid),
            "traffic": tuple(b - a for a, b in zip(before, after, strict=True)),
        }
        if case["kind"] != "conv":  # a pool's backward is the halo exchange's transpose: no other exercise
            dy = np.random.default_rng([case["seed"], 2]).standard_normal(layer.output_shape(x.shape))
            (r0, r1), (c0, c1) = spatial.plan.out_block(comm.rank)
            dx_local = spatial.backward(np.ascontiguousarray(dy[:, :, r0:r1, c0:c1]))
            result["dx"] = gather_from_grid(comm, dx_local, grid)
        out.append(result)
    return out


def check(grid, cases):
    per_rank = run(worker, grid[0] * grid[1], grid, cases, timeout=60)
    for index, case in enumerate(cases):
        x = make_input(case)
        layer = make_layer(case["kind"], case["channels"], case["kernel"], case["stride"], case["padding"],
                           case["seed"])
        y = layer.forward(x)
        where = f"{case} on grid {grid}"
        got = per_rank[0][index]
        np.testing.assert_allclose(
            got["y"], y, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(y).max()), err_msg=where
        )
        if case["kind"] != "conv":
            dy = np.random.default_rng([case["seed"], 2]).standard_normal(y.shape)
            np.testing.assert_allclose(got["dx"], layer.backward(dy), rtol=1e-12, atol=1e-13, err_msg=where)
        plan = HaloPlan.build(case["hw"], case["kernel"], case["stride"], case["padding"], grid)
        for rank, results in enumerate(per_rank):
            sent, received = plan.halo_bytes(rank, case["batch"], case["channels"], itemsize=8)
            assert results[index]["traffic"] == (sent, received, *plan.messages(rank)), (
                f"{where}, rank {rank}"
            )


def case(kind, kernel, stride, padding, grid, extra=(0, 0), channels=2, batch=2, seed=0):
    """A case whose image gives every rank of the grid at least one output row and column."""
    hw = tuple(max(1, k - 2 * padding, (parts - 1) * stride + k - 2 * padding) + e
               for parts, k, e in zip(grid, (kernel, kernel), extra, strict=True))
    return {"kind": kind, "kernel": kernel, "stride": stride, "padding": padding, "hw": hw,
            "channels": channels, "batch": batch, "seed": seed}


@pytest.mark.parametrize("grid", GRIDS, ids=[f"{h}x{w}" for h, w in GRIDS])
def test_split_pools_and_conv_forward_equal_one_process(grid):
    cases = [case("max", 3, 1, 1, grid, (3, 2)), case("avg", 3, 2, 1, grid, (1, 4), seed=1),
             case("max", 2, 2, 0, grid, (2, 3), seed=2), case("avg", 5, 1, 2, grid, (2, 1), seed=3),
             case("conv", 3, 1, 1, grid, (4, 3), seed=4), case("conv", 5, 2, 2, grid, (1, 2), seed=5),
             case("conv", 1, 1, 0, grid, (1, 1), seed=6)]
    check(grid, cases)


def test_multi_hop_halo_reaches_past_a_one_row_neighbour():
    """Pieces of one row and a halo of two rows: the second row comes from two ranks away."""
    check((5, 1), [case("avg", 5, 1, 2, (5, 1), (1, 3)), case("conv", 5, 1, 2, (5, 1), (1, 3), seed=1)])


@settings(max_examples=4)
@given(grid=st.sampled_from(GRIDS), data=st.data())
def test_split_layers_hypothesis(grid, data):
    cases = []
    for seed in range(data.draw(st.integers(1, 3))):
        kernel, stride = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 3))
        padding = data.draw(st.integers(0, kernel // 2))
        kind = data.draw(st.sampled_from(["conv", "max", "avg"]))
        cases.append(case(kind, kernel, stride, padding, grid,
                          (data.draw(st.integers(0, 6)), data.draw(st.integers(0, 6))),
                          data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2)), seed))
    check(grid, cases)
