"""2-byte storage of FP16 and BF16 (1 byte for FP8): exact round trips, and the ledger counts the width."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import GELU, Conv2d, Flatten, LayerNorm, Linear, MaxPool2d, ReLU, Sequential, Tanh
from minidist.nn import TransformerBlock as Block
from minidist.nn.loss import CrossEntropyLoss
from minidist.nn.module import Module
from minidist.nn.nbytes import nbytes_of, saved_arrays
from minidist.nn.runner import Attachment
from minidist.optim import SGD
from minidist.precision import BF16, FP8_E4M3, FP8_E5M2, FP16, FP32, decode, quantize
from minidist.precision.fp8_training import fp8_trainer, train_step
from minidist.precision.storage import HalfStoredActivations, load, store
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


MODELS = {   # (model built from an rng, input shape, classes): the layers the recipe's models use
    "mlp": (lambda r: Sequential(Linear(6, 8, rng=r), ReLU(), Linear(8, 3, rng=r)), (16, 6), 3),
    "gelu + layernorm": (lambda r: Sequential(Linear(6, 8, rng=r), GELU(), LayerNorm(8), Tanh(),
                                              Linear(8, 3, rng=r)), (16, 6), 3),
    "convnet": (lambda r: Sequential(Conv2d(2, 3, 3, padding=1, rng=r), ReLU(), MaxPool2d(2), Flatten(),
                                     Linear(12, 4, rng=r)), (5, 2, 4, 4), 4),
    "nested: a view of the pool's output": (
        lambda r: Sequential(Sequential(MaxPool2d(2), Flatten(), Linear(8, 3, rng=r))), (5, 2, 4, 4), 3),
    "transformer block": (lambda r: Sequential(Block(8, 2, rng=r), Flatten(), Linear(24, 3, rng=r)),
                          (4, 3, 8), 3),
}


class AfterForward(Attachment):
    """Records, at after_loss (the ledger's "after forward" point), the activation bytes the model holds
    and the float32 saved arrays whose values are all float16 values (what 2-byte storage may keep)."""

    def __init__(self, model):
        self.model, self.points = model, []

    def after_loss(self, dy):
        saved = [v for v in flatten(saved_arrays(self.model)) if isinstance(v, np.ndarray)]
        exact = [v for v in saved if v.dtype == np.float32 and np.array_equal(v, v.astype(np.float16))]
        self.points.append((held_bytes(self.model)["activations"], nbytes_of(exact),
                            sorted(str(v.dtype) for v in saved)))
        return dy


def flatten(values):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from flatten(v)
        elif isinstance(v, dict):
            yield from flatten(list(v.values()))
        else:
            yield v


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("accum_fmt", [None, FP16])
def test_the_recipe_stores_what_forward_saved_in_2_bytes_and_trains_bitwise_alike(name, accum_fmt):
    """Three steps of fp8_trainer with and without half_storage: losses, gradients and weights bitwise
    equal; after forward every float32 saved array of float16 values is held in 2 bytes (the ledger's
    activations drop by exactly half those arrays' bytes, memory shared by two layers halved once), and
    after the pass all are float32 again, holding the same bytes."""
    build, shape, classes = MODELS[name]
    data = np.random.default_rng(0)
    batches = [(data.standard_normal(shape).astype(np.float32), data.integers(0, classes, shape[0]))
               for _ in range(3)]
    runs = {}
    for half in (False, True):
        model = build(np.random.default_rng(1))
        trainer = fp8_trainer(model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(),
                              np.random.default_rng(3), accum_fmt=accum_fmt, chunk=4, half_storage=half)
        probe = AfterForward(model)
        trainer.runner.attachments.append(probe)
        losses, grads, after = [], [], []
        for x, target in batches:
            report = train_step(trainer, x, target)
            losses.append(report.loss)
            grads.append([p.grad.copy() for p in model.parameters()])
            kept = [v for v in flatten(saved_arrays(model)) if isinstance(v, np.ndarray)]
            assert all(v.dtype != np.float16 for v in kept)          # after the pass: float32 again
            after.append(held_bytes(model)["activations"])            # ... sharing memory as it did
        runs[half] = losses, grads, [p.data.copy() for p in model.parameters()], probe.points, after
    (loss32, grads32, weights32, points32, after32), (loss16, grads16, weights16, points16, after16) = (
        runs[False], runs[True])
    assert np.array_equal(loss32, loss16) and after32 == after16
    for a, b in zip(flatten(grads32 + [weights32]), flatten(grads16 + [weights16]), strict=True):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    for (bytes32, exact32, _), (bytes16, exact16, dtypes16) in zip(points32, points16, strict=True):
        assert exact16 == 0 and bytes32 - bytes16 == exact32 // 2      # every exact array halved, no other
        assert (exact32 > 0) == ("float16" in dtypes16)
    if name != "transformer block":     # inside one unit everything is float32: nothing to store in 2 bytes
        assert points32[0][1] > 0


def test_2_byte_storage_leaves_no_float16_behind_a_forward_only_pass():
    rng = np.random.default_rng(1)
    model = Sequential(Linear(6, 8, rng=rng), GELU(), Linear(8, 3, rng=rng))
    trainer = fp8_trainer(model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), rng, accum_fmt=None)
    trainer.forward(np.ones((4, 6), dtype=np.float32))
    assert model[0]._x2d.dtype == model[1]._x.dtype == np.float32


class Saves(Module):
    """Saves its input, a view of it and a float32-only array (1 + 2^-20 is no float16 value)."""

    def forward(self, x):
        self.x, self.rows, self.fine = x, x[::2], np.full_like(x, 1 + 2.0**-20)
        return x


@given(st.lists(st.floats(-6e4, 6e4, width=16), min_size=1, max_size=30))
def test_the_attachment_round_trips_saved_arrays_bitwise(xs):
    """Stored between forward and backward: float16 (the view a view of the same block), half the bytes;
    loaded before backward: bitwise the arrays forward saved, the view again a view of the input."""
    x = np.array(xs, dtype=np.float32)
    layer, attachment = Saves(), HalfStoredActivations()
    attachment.before_forward(0, layer, x)
    layer.forward(x.copy())
    saved = {name: getattr(layer, name).copy() for name in ("x", "rows", "fine")}
    attachment.after_forward(0, layer, x)
    assert layer.x.dtype == layer.rows.dtype == np.float16 and layer.rows.base is layer.x
    assert layer.fine.dtype == np.float32
    assert held_bytes(layer)["activations"] == 2 * x.size + 4 * x.size
    attachment.before_backward(0, layer, x)
    for name, value in saved.items():
        assert getattr(layer, name).dtype == np.float32
        assert np.array_equal(getattr(layer, name).view(np.uint32), value.view(np.uint32))
    assert np.shares_memory(layer.rows, layer.x)
