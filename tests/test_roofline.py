"""The roofline: FLOP and byte counts from shapes equal the hand formulas; bounds and intensities."""

import numpy as np
import pytest

from minidist.hardware.roofline import Machine, communication_intensity, layer_cost, model_costs, step_bound
from minidist.nn import BatchNorm2d, Conv2d, Flatten, LayerNorm, Linear, MaxPool2d, ReLU, Sequential, Sigmoid


def rng():
    return np.random.default_rng(0)


def test_linear_counts():
    n, i, o = 32, 100, 60
    c = layer_cost(Linear(i, o, rng=rng()), (n, i))
    assert c.forward_flops == 2 * n * i * o and c.backward_flops == 4 * n * i * o
    assert c.forward_bytes == 4 * (n * i + (i * o + o) + n * o)
    assert c.backward_bytes == 4 * (n * o + 2 * n * i + 2 * (i * o + o))
    assert c.output_shape == (n, o)


def test_conv_pool_flatten_counts():
    conv = Conv2d(3, 8, 3, padding=1, rng=rng())
    c = layer_cost(conv, (2, 3, 16, 16), itemsize=8)
    out = 2 * 8 * 16 * 16
    assert c.forward_flops == 2 * out * 3 * 9
    assert c.forward_bytes == 8 * (2 * 3 * 256 + (8 * 3 * 9 + 8) + out)
    costs = model_costs(Sequential(conv, ReLU(), MaxPool2d(2), Flatten()), (2, 3, 16, 16))
    assert [c.output_shape for c in costs] == [(2, 8, 16, 16), (2, 8, 16, 16), (2, 8, 8, 8), (2, 512)]
    assert costs[1].forward_flops == out and costs[1].forward_bytes == 4 * 2 * out
    assert costs[2].forward_flops == 2 * 8 * 64 * 3


def test_norm_and_activation_counts():
    bn = layer_cost(BatchNorm2d(8), (4, 8, 5, 5))
    e = 4 * 8 * 25
    assert bn.forward_flops == 8 * e and bn.forward_bytes == 4 * (2 * e + 16)
    assert bn.backward_bytes == 4 * (3 * e + 32)
    ln = layer_cost(LayerNorm(10), (6, 10))
    assert ln.forward_bytes == 4 * (2 * 60 + 20)
    sig = layer_cost(Sigmoid(), (7, 3))
    assert sig.forward_flops == 3 * 21 and sig.forward_intensity == 3 * 21 / (4 * 42)


def test_machine_bounds_and_ridge():
    m = Machine(peak=100.0, memory_bw=10.0, network_bw=1.0)
    assert m.ridge == 10.0 and m.attainable(2.0) == 20.0 and m.attainable(50.0) == 100.0
    assert (
        m.bound(1000, 10) == "compute" and m.bound(10, 1000) == "memory" and m.bound(10, 10, 100) == "network"
    )
    assert m.time(1000, 10, 5) == 10.0
    big = model_costs(Sequential(Linear(1024, 1024, rng=rng())), (4096, 1024))
    small = model_costs(Sequential(ReLU()), (4096, 1024))
    v100 = Machine()
    assert step_bound(big, v100)[0] == "compute" and step_bound(small, v100)[0] == "memory"
    with pytest.raises(ValueError):
        Machine(peak=0)
    with pytest.raises(ValueError):
        layer_cost(ReLU(), (2, 2), itemsize=0)


def test_communication_intensity_formulas():
    w, b = [8, 16, 8], 10
    flops = 3 * (2 * b * 8 * 16 + 2 * b * 16 * 8)
    params = 8 * 16 + 16 + 16 * 8 + 8
    assert communication_intensity(w, b, "data", 4) == (flops / 4, 2 * 3 / 4 * params * 4)
    assert communication_intensity(w, b, "tensor", 2, itemsize=8) == (flops / 2, 2 * 1 / 2 * b * (8 + 8) * 8)
    assert communication_intensity(w, b, "pipeline", 2) == (flops / 2, 2 * b * 16 * 4)
    assert communication_intensity(w, b, "pipeline", 1)[1] == 0.0
    with pytest.raises(ValueError, match="even number"):
        communication_intensity([8, 8, 8, 8], b, "tensor", 2)
    with pytest.raises(ValueError, match="strategy"):
        communication_intensity(w, b, "spatial", 2)


def test_machine_and_costs_refuse_bad_numbers_with_a_clear_error():
    with pytest.raises(TypeError, match="Machine: peak must be a real number"):
        Machine(peak="1e12")
    for bad in (float("nan"), float("inf"), -1.0, True):
        with pytest.raises((ValueError, TypeError), match="network_bw"):
            Machine(network_bw=bad)
    m = Machine(peak=100.0, memory_bw=10.0, network_bw=1.0)
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError, match="intensity"):
            m.attainable(bad)
        with pytest.raises(ValueError, match="flops"):
            m.bound(bad, 10)
        with pytest.raises(ValueError, match="sent"):
            m.time(10, 10, bad)
    assert m.attainable(0) == 0.0
    for shape in ((-2, 3), (2, 0), (True, 3)):
        with pytest.raises(ValueError, match="input_shape"):
            layer_cost(Linear(3, 4, rng=rng()), shape)
    with pytest.raises(ValueError, match="integers >= 1"):
        communication_intensity([4, 4], True, "data", 2)
