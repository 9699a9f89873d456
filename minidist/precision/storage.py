"""Low-precision tensors stored in their own width: FP16 as ``np.float16`` (2 bytes), BF16 and the other
formats of at most 16 bits as their bit patterns (``encode``: BF16 in ``uint16``, FP8 in ``uint8``).

The tutorial's "halve the size of activation and gradient tensors … larger minibatches": elsewhere the
emulation holds low-precision *values* in float32 (4 bytes each); ``store`` keeps them in the format's
width, so the memory ledger (minidist/sim/memory.py, which counts ``array.nbytes``) sees 2 bytes per FP16 or
BF16 element, 1 per FP8 element. ``load`` gives float32 back for computing.

    store(x, fmt)   = quantize(x, fmt) in fmt.total_bits / 8 bytes per element (round-to-nearest-even)
    load(s, fmt)    = the float32 values of s (exact: every FP16/BF16/FP8 value is a float32)

Round trips are exact: load(store(x)) == quantize(x) for every x, and store(load(s)) == s for every
stored pattern s (NaN patterns come back as the format's canonical NaN).

``HalfStoredActivations`` applies it where the recipe stores tensors between forward and backward: after
each unit's forward, every float32 array that forward saved on the unit's modules (nn.checkpoint's rule:
attributes assigned during the forward that are neither parameters, buffers nor modules; arrays, not the
lists and dicts an RNN keeps) is kept as np.float16 when all its values are float16 values, and loaded back to
float32 just before the unit's backward (at the end of the pass for a unit that had none):

    Linear's input, GELU's input, Conv2d's columns, MaxPool2d's padded input   values rounded at a layer
                                                         boundary (FP16, FP8): 2 bytes per element
    LayerNorm's x̂ and 1/σ, attention's probabilities, Tanh's output     float32 results computed inside
                                                         the layer: not float16 values, they stay 4 bytes
    ReLU's and Dropout's masks                           booleans: 1 byte already

float16 → float32 being exact, every backward computes bitwise as it did without the attachment.
"""

from __future__ import annotations

import numpy as np

from minidist.nn.checkpoint import assigned_since
from minidist.nn.runner import Attachment

from .bits import decode, encode
from .formats import FP16, FloatFormat, check_format, code_dtype, fits_in
from .rounding import quantize


def store(x, fmt: FloatFormat) -> np.ndarray:
    """x (any shape, float) rounded to fmt (nearest-even) and kept in fmt's width: np.float16 for FP16,
    the bit patterns (uint8/uint16) for other formats of at most 16 bits."""
    check_format(fmt)
    if fmt.total_bits > 16 or not fits_in(fmt, np.float32):
        raise ValueError(f"store keeps formats of at most 16 bits whose values fit float32, got {fmt.name}")
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"store expects a float array, got dtype {x.dtype}")
    if fmt == FP16:
        return quantize(x, FP16).astype(np.float16)   # exact: the values already are FP16 values
    return encode(x, fmt)


def load(stored: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """The float32 values of an array made by store(·, fmt), same shape."""
    check_format(fmt)
    stored = np.asarray(stored)
    expected = np.dtype(np.float16) if fmt == FP16 else np.dtype(code_dtype(fmt))
    if stored.dtype != expected:
        raise TypeError(f"load: {fmt.name} is stored as {expected}, got dtype {stored.dtype}")
    if fmt == FP16:
        return stored.astype(np.float32)
    return decode(stored, fmt, dtype=np.float32)


class HalfStoredActivations(Attachment):
    """A runner attachment: what each unit's forward saved, in 2 bytes where exact, from its forward to its
    backward (see the module docstring), so a ledger point in between (after_loss: "after forward") counts
    2 bytes per stored element. Append it after the recipe's attachments: its after_forward then fires
    first, before the recipe rounds the unit's output."""

    def __init__(self):
        self._before: list = []
        self._stored: dict[int, list] = {}     # unit index -> [(module, name, the value stored)]

    def before_forward(self, i, layer, x):
        self._before = [(module, dict(vars(module))) for module in layer.modules()]
        return x

    def after_forward(self, i, layer, y):
        halves: dict[int, object] = {}         # one array saved under two names is stored once
        stored = []
        for module, name, value in assigned_since(self._before).entries:
            if id(value) not in halves:
                halves[id(value)] = _as_half(value)
            if halves[id(value)] is not None:
                setattr(module, name, halves[id(value)])
                stored.append((module, name, halves[id(value)]))
        self._restore(self._stored.pop(i, []))  # run twice in a pass: what the second left alone
        self._stored[i], self._before = stored, []
        return y

    def before_backward(self, i, layer, dy):
        self._restore(self._stored.pop(i, []))
        return dy

    def end(self) -> None:
        """Units that ran no backward (below the first with parameters; a forward-only pass; a pipeline
        stage's forward, whose stash its later backward pass restores) get their float32 arrays back."""
        for entries in self._stored.values():
            self._restore(entries)
        self._stored = {}

    @staticmethod
    def _restore(entries) -> None:
        loaded: dict[int, object] = {}
        for module, name, half in entries:
            if getattr(module, name, None) is half:       # not rebound since: load it back
                if id(half) not in loaded:
                    loaded[id(half)] = half.astype(np.float32)
                setattr(module, name, loaded[id(half)])


def _as_half(value) -> np.ndarray | None:
    """value as np.float16 if it is a float32 array of float16 values (compared bitwise: NaN and any
    float32-only value refuse), else None."""
    if not isinstance(value, np.ndarray) or value.dtype != np.float32 or value.size == 0:
        return None
    half = value.astype(np.float16)
    return half if np.array_equal(half.astype(np.float32).view(np.uint32), value.view(np.uint32)) else None
