"""2-byte storage of FP16 and BF16 (1 byte for FP8): exact round trips, and the ledger counts the width."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import Linear, ReLU, Sequential
from minidist.nn.loss import CrossEntropyLoss
from minidist.optim import SGD
from minidist.precision import BF16, FP8_E4M3, FP8_E5M2, FP16, FP32, decode, quantize
from minidist.precision.fp8_training import fp8_trainer
from minidist.precision.storage import load, store
from minidist.sim.memory import held_bytes

FORMATS = [(FP16, np.float16, 2), (BF16, np.uint16, 2), (FP8_E5M2, np.uint8, 1), (FP8_E4M3, np.uint8, 1)]


@pytest.mark.parametrize("fmt, dtype, width", FORMATS)
def test_every_finite_pattern_round_trips_exactly(fmt, dtype, width):
    """All 2^bits patterns: bits -> float32 -> bits identical for every finite value (both zeros too)."""
    patterns = np.arange(2**fmt.total_bits, dtype=np.uint32).astype(dtype if width == 1 else np.uint16)
    values = decode(patterns, fmt, dtype=np.float32)
    finite = np.isfinite(values)
    stored = store(values[finite], fmt)
    assert stored.dtype == dtype and stored.nbytes == width * int(finite.sum())
    as_bits = stored.view(np.uint16) if fmt == FP16 else stored
    assert np.array_equal(as_bits, patterns[finite])
    assert np.array_equal(load(stored, fmt).view(np.uint32), values[finite].view(np.uint32))


@given(st.sampled_from(FORMATS), st.lists(st.floats(-1e5, 1e5, width=32), min_size=1, max_size=40))
def test_load_of_store_is_quantize(entry, xs):
    fmt, _, _ = entry
    x = np.array(xs, dtype=np.float32)
    np.testing.assert_array_equal(load(store(x, fmt), fmt), quantize(x, fmt, saturate=False))


@given(st.integers(1, 6), st.integers(1, 9), st.sampled_from(FORMATS))
def test_the_ledger_counts_the_stored_width(rows, cols, entry):
    fmt, _, width = entry
    x = np.random.default_rng(rows * cols).standard_normal((rows, cols)).astype(np.float32)
    held = held_bytes(extra={"activations": [store(x, fmt)], "gradients": [x]})
    assert held["activations"] == width * x.size and held["gradients"] == 4 * x.size


def test_bad_input():
    with pytest.raises(ValueError, match="16 bits"):
        store(np.ones(2), FP32)
    with pytest.raises(TypeError, match="float array"):
        store(np.ones(2, dtype=np.int32), BF16)
    with pytest.raises(TypeError, match="stored as uint16"):
        load(np.ones(2, dtype=np.float32), BF16)


def test_the_recipe_keeps_linear_inputs_in_2_bytes_and_trains_bitwise_alike():
    x = np.random.default_rng(0).standard_normal((16, 6)).astype(np.float32)
    target = np.arange(16) % 3
    held, grads = [], []
    for half in (False, True):
        model = Sequential(Linear(6, 8, rng=np.random.default_rng(1)), ReLU(),
                           Linear(8, 3, rng=np.random.default_rng(2)))
        trainer = fp8_trainer(model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(),
                              np.random.default_rng(3), accum_fmt=None, half_storage=half)
        trainer.forward_backward(x, target)
        kept = np.float16 if half else np.float32
        assert model[0]._x2d.dtype == kept and model[2]._x2d.dtype == kept
        held.append(held_bytes(model)["activations"])
        grads.append([p.grad.copy() for p in model.parameters()])
    assert held[0] - held[1] == 2 * (16 * 6 + 16 * 8)           # two bytes saved per stored input element
    for a, b in zip(*grads, strict=True):
        assert np.array_equal(a, b)
