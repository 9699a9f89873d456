"""Bit patterns of a FloatFormat: ``encode(x, fmt)`` and ``decode(bits, fmt)``.

Layout (most significant bit first), as IEEE half and ml_dtypes store it:

    sign (1 bit) | exponent field f (E bits) | fraction t (M bits)

encode rounds to nearest-even first (``quantize``), then reads f and t off the exact value:
normal numbers have f = ⌊log2 |x|⌋ + bias and t = |x| / 2^(f − bias − M) − 2^M, subnormals f = 0 and
t = |x| / 2^(1 − bias − M). decode computes the value back from (s, f, t).
"""

from __future__ import annotations

import numpy as np

from .formats import FloatFormat, check_format, code_dtype, fits_in
from .rounding import quantize


def encode(x, fmt: FloatFormat) -> np.ndarray:
    """The bit patterns of x in fmt (round-to-nearest-even first), as the smallest unsigned int type.

    Layout (most significant first): sign | exponent field | fraction — as IEEE half and ml_dtypes.
    Inf → field all ones, fraction 0. NaN → the canonical quiet NaN (fraction 10…0; "fn": all ones),
    with the sign of the input NaN. To encode a stochastically rounded value, quantize first: encode
    of a representable value is exact.
    """
    check_format(fmt)
    value = quantize(x, fmt).astype(np.float64)  # exact: every fmt value is a float64
    sign = np.signbit(value).astype(np.uint64)
    magnitude = np.abs(value)
    is_nan, is_inf = np.isnan(magnitude), np.isinf(magnitude)
    finite = np.where(is_nan | is_inf, 0.0, magnitude)
    m, ones = fmt.man_bits, 2 ** fmt.exp_bits - 1
    _, exponent = np.frexp(finite)               # finite = f · 2^exponent, f in [0.5, 1)
    leading = exponent.astype(np.int64) - 1      # finite in [2^leading, 2^(leading+1))
    normal = finite >= fmt.min_normal
    field = np.where(normal, leading + fmt.bias, 0)
    # the fraction bits as an integer: finite / quantum − implicit bit (exact: a power-of-two scaling)
    fraction = np.where(normal, np.ldexp(finite, m - leading) - 2.0 ** m, np.ldexp(finite, m - fmt.emin))
    field = np.where(is_inf | is_nan, ones, field).astype(np.uint64)
    nan_fraction = 2 ** m - 1 if fmt.finite_only else 2 ** (m - 1)
    fraction = np.where(is_nan, nan_fraction, np.where(is_inf, 0, fraction)).astype(np.uint64)
    bits = (sign << np.uint64(fmt.total_bits - 1)) | (field << np.uint64(m)) | fraction
    return bits.astype(code_dtype(fmt))


def decode(bits, fmt: FloatFormat, dtype=np.float64) -> np.ndarray:
    """The values of bit patterns of fmt, as ``dtype`` (float64 by default; float32 if fmt fits in it)."""
    check_format(fmt)
    bits = np.asarray(bits)
    if not np.issubdtype(bits.dtype, np.integer):
        raise TypeError(f"decode expects integer bit patterns, got dtype {bits.dtype}")
    if bits.size and (bits.min() < 0 or int(bits.max()) >= 2 ** fmt.total_bits):
        raise ValueError(f"decode: {fmt.name} patterns lie in [0, 2^{fmt.total_bits}), "
                         f"got range [{bits.min()}, {bits.max()}]")
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"decode: dtype must be float32 or float64, got {dtype}")
    bits = bits.astype(np.uint64)
    m, ones = fmt.man_bits, 2 ** fmt.exp_bits - 1
    negative = ((bits >> np.uint64(fmt.total_bits - 1)) & np.uint64(1)).astype(bool)
    field = ((bits >> np.uint64(m)) & np.uint64(ones)).astype(np.int64)
    fraction = (bits & np.uint64(2 ** m - 1)).astype(np.float64)
    value = np.where(field == 0,
                     np.ldexp(fraction, fmt.emin - m),                                   # 0.t · 2^emin
                     np.ldexp(fraction + 2.0 ** m, field - fmt.bias - m))                # 1.t · 2^(f−bias)
    if fmt.finite_only:
        value = np.where((field == ones) & (fraction == 2 ** m - 1), np.nan, value)
    else:
        value = np.where(field == ones, np.where(fraction == 0, np.inf, np.nan), value)
    value = np.where(negative, -value, value)
    if np.dtype(dtype) == np.float32 and not fits_in(fmt, np.float32):
        raise ValueError(f"decode: {fmt.name} values do not all fit float32; use float64")
    return value.astype(dtype)
