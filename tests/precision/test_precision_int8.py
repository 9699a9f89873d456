"""int8 inference on the trained digits models: within 1 point of FP32 with 4× smaller weights."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.data import iterate_batches, load_digits
from minidist.nn import Conv2d, CrossEntropyLoss, Flatten, Linear, MaxPool2d, ReLU, Sequential
from minidist.optim import SGD
from minidist.precision.int8 import (
    Int8Layer,
    per_channel_scales,
    per_tensor_scale,
    quantize_model,
    quantize_symmetric,
    weight_bytes,
)
from minidist.recipes.demo import train_digits_mlp


def _accuracy(model, x, y) -> float:
    return float((model.forward(x).argmax(axis=1) == y).mean())


def _trained_cnn(data, epochs: int = 4) -> Sequential:
    rng = np.random.default_rng(0)
    model = Sequential(Conv2d(1, 8, 3, padding=1, rng=rng), ReLU(), MaxPool2d(2),
                       Conv2d(8, 16, 3, padding=1, rng=rng), ReLU(), MaxPool2d(2), Flatten(),
                       Linear(64, 10, rng=rng))
    opt, loss_fn = SGD(model.parameters(), lr=0.05, momentum=0.9), CrossEntropyLoss()
    batch_rng = np.random.default_rng(1)
    for _ in range(epochs):
        for idx in iterate_batches(len(data.y_train), 32, batch_rng):
            loss_fn.forward(model.forward(data.x_train[idx]), data.y_train[idx])
            opt.zero_grad()
            model.backward(loss_fn.backward())
            opt.step()
    return model


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_int8_digits_within_one_point_of_fp32_with_4x_smaller_weights(kind):
    data = load_digits(images=kind == "cnn")
    model = train_digits_mlp(epochs=8).model if kind == "mlp" else _trained_cnn(data)
    fp32 = _accuracy(model, data.x_test, data.y_test)
    qmodel = quantize_model(model, data.x_train[:256])             # calibrate on training images only
    int8 = _accuracy(qmodel, data.x_test, data.y_test)
    assert fp32 > 0.9 and abs(int8 - fp32) <= 0.01, (fp32, int8)
    stored, as_fp32 = weight_bytes(qmodel)
    int8_values = sum(layer.weight_q.nbytes for layer in qmodel if isinstance(layer, Int8Layer))
    assert 4 * int8_values == as_fp32 == weight_bytes(model)[0]    # the weights themselves: exactly 4×
    assert as_fp32 / stored > 3.7                                   # with the per-channel FP32 scales


@given(out=st.integers(1, 6), inp=st.integers(1, 6), n=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_int8_linear_is_the_integer_accumulator_rescaled(out, inp, n, seed):
    rng = np.random.default_rng(seed)
    layer = Linear(inp, out, rng=rng)
    x = rng.standard_normal((n, inp)).astype(np.float32)
    q = Int8Layer(layer, input_scale=float(np.abs(x).max()) / 127 or 1.0)
    assert q.weight_q.dtype == np.int8 and np.abs(q.weight_q).max() == 127     # each channel's peak → ±127
    xq = quantize_symmetric(x, q.input_scale).astype(np.int64)
    acc = xq @ q.weight_q.astype(np.int64).T                         # the int32 accumulator, in integers
    assert np.array_equal(q.accumulate(x), acc)
    expected = (acc * (q.input_scale * q.weight_scale.astype(np.float64))
                + layer.bias.data).astype(np.float32)
    np.testing.assert_array_equal(q.forward(x), expected)
    # each weight is within half a step of its channel's scale
    w_back = q.weight_q * per_channel_scales(layer.weight.data)[:, None]
    assert np.all(np.abs(w_back - layer.weight.data)
                  <= 0.5 * per_channel_scales(layer.weight.data)[:, None] + 1e-7)


def test_int8_bad_input_is_refused():
    with pytest.raises(TypeError, match="Linear or Conv2d"):
        Int8Layer(ReLU(), 1.0)
    with pytest.raises(ValueError, match="input_scale must be a finite number > 0"):
        Int8Layer(Linear(2, 2, rng=np.random.default_rng(0)), 0.0)
    with pytest.raises(NotImplementedError, match="inference only"):
        Int8Layer(Linear(2, 2, rng=np.random.default_rng(0)), 1.0).backward(np.ones((1, 2)))


def test_int8_refuses_values_it_cannot_represent():
    """An inf used to make the scale inf (every value quantised to 0), a NaN was skipped by max (scale 1),
    an infinite input scale was accepted, and a NaN input gave a finite output: each is now refused."""
    for bad in (np.array([np.inf, 1.0]), np.array([np.nan, 1.0])):
        with pytest.raises(ValueError, match="per_tensor_scale input must be finite"):
            per_tensor_scale(bad)
    assert per_tensor_scale(np.array([-254.0, 1.0])) == 2.0
    layer = Linear(2, 2, rng=np.random.default_rng(0))
    for bad in (np.inf, np.nan, True, "1"):
        with pytest.raises((ValueError, TypeError), match="input_scale"):
            Int8Layer(layer, bad)
    quantised = Int8Layer(layer, 0.01)
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError, match="Int8Layer input must be finite"):
            quantised.forward(np.array([[bad, 1.0]]))
    layer.weight.data[0, 0] = np.nan
    with pytest.raises(ValueError, match="per_channel_scales weight must be finite"):
        Int8Layer(layer, 0.01)
