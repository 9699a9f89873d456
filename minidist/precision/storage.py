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

import weakref

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
    first, before the recipe rounds the unit's output.

    Memory is converted by its root (the array owning it): arrays saved as views of one block (a Linear's
    input and the MaxPool2d output it was reshaped from, in a nested Sequential) become views of one
    float16 block, and are loaded back as views of one float32 block, so sharing is kept both ways."""

    def __init__(self):
        self._before: list = []
        self._stored: dict[int, list] = {}     # unit index -> [(module, name, the value stored)]
        self._halves, self._loaded = _Copies(), _Copies()   # float32 root -> float16 copy, and back

    def before_forward(self, i, layer, x):
        self._before = [(module, dict(vars(module))) for module in layer.modules()]
        return x

    def after_forward(self, i, layer, y):
        stored = []
        for module, name, value in assigned_since(self._before).entries:
            half = self._half(value)
            if half is not None:
                setattr(module, name, half)
                stored.append((module, name, half))
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

    def _half(self, value) -> np.ndarray | None:
        """value as a view of its root's float16 copy if the root is a float32 block of float16 values
        (compared bitwise: NaN and any float32-only value refuse), else None."""
        if not isinstance(value, np.ndarray) or value.dtype != np.float32 or value.size == 0:
            return None
        root = _root(value)
        half_root = self._halves.get(root)
        if half_root is None:
            if root.dtype != np.float32 or not root.flags.c_contiguous:   # e.g. a view of uint32 bits
                return _exact_half(value)
            half_root = _exact_half(root)
            if half_root is None:
                return _exact_half(value) if value is not root else None
            self._halves.put(root, half_root)
        return _same_view(value, root, half_root)

    def _restore(self, entries) -> None:
        for module, name, half in entries:
            if getattr(module, name, None) is half:       # not rebound since: load it back
                half_root = _root(half)
                full_root = self._loaded.get(half_root)
                if full_root is None:
                    full_root = half_root.astype(np.float32)
                    self._loaded.put(half_root, full_root)
                setattr(module, name, _same_view(half, half_root, full_root))


class _Copies:
    """root -> its copy in another dtype, both held weakly: an entry lives while both arrays do (an id
    reused by a new array after the old one died is not taken for it)."""

    def __init__(self):
        self._refs: dict[int, tuple[weakref.ref, weakref.ref]] = {}

    def get(self, root: np.ndarray) -> np.ndarray | None:
        key, copy = self._refs.get(id(root), (None, None))
        return copy() if key is not None and key() is root else None

    def put(self, root: np.ndarray, copy: np.ndarray) -> None:
        self._refs = {k: (a, b) for k, (a, b) in self._refs.items() if a() is not None and b() is not None}
        self._refs[id(root)] = (weakref.ref(root), weakref.ref(copy))


def _exact_half(a: np.ndarray) -> np.ndarray | None:
    """a (float32) as np.float16 if every value is a float16 value, compared bitwise; else None."""
    half = a.astype(np.float16)
    return half if np.array_equal(half.astype(np.float32).view(np.uint32), a.view(np.uint32)) else None


def _root(a: np.ndarray) -> np.ndarray:
    """The array that owns a's memory (a itself if it owns it)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _same_view(view: np.ndarray, root: np.ndarray, other_root: np.ndarray) -> np.ndarray:
    """The view of other_root (C-contiguous, root's shape, another item size) that ``view`` is of root."""
    if view is root:
        return other_root
    scale = other_root.itemsize / root.itemsize
    offset = int((view.__array_interface__["data"][0] - root.__array_interface__["data"][0]) * scale)
    strides = tuple(int(stride * scale) for stride in view.strides)
    return np.ndarray(view.shape, other_root.dtype, buffer=other_root, offset=offset, strides=strides)
