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

``HalfStoredActivations`` applies it where the recipe stores tensors between forward and backward: each
plain Linear unit's saved input (the activation its dW needs) is kept as np.float16 when its values are
float16 values (FP16 and FP8 activations are), so the ledger's activation bytes halve and, float16 → float32
being exact, backward computes bitwise the same.
"""

from __future__ import annotations

import numpy as np

from minidist.nn.linear import Linear
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
    """A runner attachment: after each plain Linear unit's forward, its saved input becomes np.float16 if
    that is exact (else it stays as it is). Append it after the recipe's attachments."""

    def after_forward(self, i, layer, y):
        saved = getattr(layer, "_x2d", None) if type(layer) is Linear else None
        if saved is not None and saved.dtype == np.float32:
            half = saved.astype(np.float16)
            if np.array_equal(half.astype(np.float32), saved):    # exact: NaN and a float32-only value stay
                layer._x2d = half
        return y
