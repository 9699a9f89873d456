"""The seeds' devices: peaks from their parts, ridge points, the Linear crossing batch, persistent RNNs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.hardware.devices import (
    DEVICES,
    TITAN_X_REGISTERS,
    largest_persistent_rnn,
    linear_crossing_batch,
    rnn_step_cost,
)
from minidist.hardware.roofline import Machine, layer_cost
from minidist.nn import Linear


def test_the_seeds_numbers():
    assert DEVICES["TPU v1 (int8)"].peak == 65536 * 2 * 700e6
    assert round(DEVICES["TPU v1 (int8)"].peak / 1e12) == 92
    assert round(DEVICES["TPU v1 (int8)"].memory_bw / 1e9, 1) == 34.1
    assert DEVICES["GP100 (FP16)"].peak == pytest.approx(2 * DEVICES["GP100 (FP32)"].peak, rel=0.01)
    assert round(DEVICES["V100 (FP32)"].peak / 1e12, 1) == 15.7 == Machine().peak / 1e12   # roofline default
    assert round(DEVICES["V100 (tensor cores)"].peak / 1e12) == 125
    assert DEVICES["TPU v2"].ridge == 75
    assert TITAN_X_REGISTERS == 6 * 2**20                          # "up to 6 MB on Maxwell Titan X"


@given(i=st.integers(1, 4096), o=st.integers(1, 4096), itemsize=st.sampled_from([1, 2, 4]),
       device=st.sampled_from(sorted(DEVICES)))
def test_linear_crossing_batch_is_where_layer_cost_crosses_the_ridge(i, o, itemsize, device):
    machine = DEVICES[device]
    b = linear_crossing_batch(machine, i, o, itemsize)
    layer = Linear(i, o, rng=np.random.default_rng(0))

    def intensity(batch):
        return layer_cost(layer, (batch, i), itemsize).forward_intensity

    if math.isinf(b):
        assert 2 * i * o / (itemsize * (i + o)) <= machine.ridge
    else:
        assert intensity(b) >= machine.ridge and (b == 1 or intensity(b - 1) < machine.ridge)


def test_persistent_rnn_turns_memory_bound_into_compute_bound():
    """1152 hidden units, FP32: 1152² · 4 B = 5.06 MiB fits the 6 MiB register file; reloading W makes a
    step of 4 sequences memory-bound, keeping it there makes it compute-bound."""
    titan = DEVICES["Titan X (Maxwell, FP32)"]
    h = largest_persistent_rnn(TITAN_X_REGISTERS)       # ⌊√(6 MiB / 4 B)⌋ = 1254: the largest that fits
    assert h * h * 4 <= TITAN_X_REGISTERS < (h + 1) * (h + 1) * 4 and 1152 <= h
    assert titan.bound(*rnn_step_cost(1152, 4, persistent=False)) == "memory"
    assert titan.bound(*rnn_step_cost(1152, 4, persistent=True)) == "compute"
    flops, nbytes = rnn_step_cost(1152, 4, persistent=True)
    assert flops / nbytes == 1152 / 4
    with pytest.raises(ValueError):
        rnn_step_cost(0, 4, True)


def test_sizes_and_counts_are_checked():
    """linear_crossing_batch(m, 0, 10) used to return inf, rnn_step_cost(nan, 1, True) (nan, nan) and
    largest_persistent_rnn(100, 0) raise ZeroDivisionError."""
    machine = DEVICES["V100 (FP32)"]
    cases = [
        (lambda: linear_crossing_batch(machine, 0, 10), "in_features must be an integer >= 1"),
        (lambda: linear_crossing_batch(machine, 10, 2.5), "out_features must be an integer >= 1"),
        (lambda: linear_crossing_batch(machine, 10, 10, itemsize=0), "itemsize must be an integer >= 1"),
        (lambda: rnn_step_cost(math.nan, 1, True), "hidden must be an integer >= 1"),
        (lambda: rnn_step_cost(8, True, True), "batch must be an integer >= 1"),
        (lambda: largest_persistent_rnn(100, 0), "itemsize must be an integer >= 1"),
        (lambda: largest_persistent_rnn(-4), "register_bytes must be an integer >= 0"),
        (lambda: largest_persistent_rnn(math.inf), "register_bytes must be an integer >= 0"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
    with pytest.raises(TypeError, match="persistent must be True or False"):
        rnn_step_cost(8, 1, "yes")
    with pytest.raises(TypeError, match="Machine"):
        linear_crossing_batch("V100", 10, 10)
    assert largest_persistent_rnn(100, 4) == 5 and rnn_step_cost(2, 3, True) == (24, 48)
