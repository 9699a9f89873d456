"""Splitting a Sequential into stages (pipeline_split.py) and the Pipeline's checks of its arguments.

The argument checks run in the constructor and at the start of train_step, before any message is sent,
so a stand-in object with rank/world_size/clock is enough here (no processes started).
"""

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import Linear, MSELoss, ReLU, Sequential
from minidist.parallel.pipeline import Pipeline
from minidist.parallel.pipeline.boundaries import (
    check_boundaries,
    layer_costs,
    split_by_cost,
    split_by_layers,
    stage_costs,
)


@given(num_layers=st.integers(1, 20), data=st.data())
def test_parallel_pipeline_split_by_layers_is_even(num_layers, data):
    P = data.draw(st.integers(1, num_layers))
    b = split_by_layers(num_layers, P)
    assert check_boundaries(b, num_layers, P) == b
    sizes = np.diff(b)
    assert sizes.max() - sizes.min() <= 1 and list(sizes) == sorted(sizes, reverse=True)


@given(costs=st.lists(st.integers(0, 50), min_size=1, max_size=8), data=st.data())
def test_parallel_pipeline_split_by_cost_is_optimal(costs, data):
    """The DP's largest stage equals the best over every possible set of cut points (brute force)."""
    P = data.draw(st.integers(1, len(costs)))
    b = split_by_cost(costs, P)
    check_boundaries(b, len(costs), P)
    best = min(max(stage_costs(costs, [0, *cuts, len(costs)]))
               for cuts in itertools.combinations(range(1, len(costs)), P - 1))
    assert max(stage_costs(costs, b)) == best


def test_parallel_pipeline_layer_costs_leave_the_model_alone(rng):
    model = Sequential(Linear(4, 8, rng=rng), ReLU(), Linear(8, 2, rng=rng))
    before = model.state_dict()
    costs = layer_costs(model, np.zeros((5, 4), np.float32))
    assert costs == [2 * 5 * 4 * 8, 5 * 8, 2 * 5 * 8 * 2]  # a multiply-add counts 2; ReLU 1 per element
    assert costs == [layer.flops(shape) for layer, shape in zip(model, [(5, 4), (5, 8), (5, 8)], strict=True)]
    assert all(np.array_equal(v, model.state_dict()[k]) for k, v in before.items())
    assert split_by_cost(costs, 2) == [0, 1, 3]


def _comm(rank, world_size):
    return SimpleNamespace(rank=rank, world_size=world_size, clock=0.0)


def test_parallel_pipeline_bad_input(rng):
    model = Sequential(Linear(3, 4, rng=rng), ReLU(), Linear(4, 2, rng=rng))
    make = lambda comm, **kw: Pipeline(comm, model, **{"loss_fn": MSELoss(), "num_micro_batches": 2,
                                                                 "schedule": "1f1b", **kw})
    with pytest.raises(ValueError, match="cannot split 3 layers into 4 stages"):
        make(_comm(0, 4))
    for bad in ([0, 1], [0, 2, 2, 3], [0, 3, 1, 3], [1, 2, 3], [0, 1, 2, 4], [0, 1.0, 2, 3]):
        with pytest.raises(ValueError, match="do not split 3 layers into 3 stages"):
            make(_comm(0, 3), boundaries=bad)
    with pytest.raises(ValueError, match="needs sample="):
        make(_comm(0, 2), boundaries="flops")
    with pytest.raises(ValueError, match="'layers', 'flops'"):
        make(_comm(0, 2), boundaries="even")
    with pytest.raises(TypeError, match="splits a Sequential"):
        Pipeline(_comm(0, 1), Linear(2, 2), loss_fn=MSELoss(), num_micro_batches=1)
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="micro-batches must be an integer >= 1"):
            make(_comm(0, 2), num_micro_batches=bad)
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        make(_comm(0, 2), schedule="no-such-schedule")
    with pytest.raises(ValueError, match="never runs"):
        make(_comm(0, 2), schedule=[[]])
    with pytest.raises(ValueError, match="one per stage"):
        make(_comm(0, 2), checkpoint=[True])
    pipe = make(_comm(0, 2), num_micro_batches=5)
    with pytest.raises(ValueError, match="batch of 4 samples into 5 micro-batches"):
        pipe.train_step(np.zeros((4, 3), np.float32), np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match="target has 3"):
        pipe.train_step(np.zeros((6, 3), np.float32), np.zeros((3, 2), np.float32))
    assert make(_comm(1, 2), boundaries="flops", sample=np.zeros((2, 3), np.float32)).boundaries == [0, 1, 3]
