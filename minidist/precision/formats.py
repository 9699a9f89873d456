"""Binary floating-point formats (FP32, FP16, BF16, FP8) and their real bit patterns.

A format with E exponent bits and M mantissa (fraction) bits stores sign s, exponent field f and
fraction bits t as

    normal     (0 < f < all ones):  (−1)^s · 1.t · 2^(f − bias)           bias = 2^(E−1) − 1
    subnormal  (f = 0):             (−1)^s · 0.t · 2^(1 − bias)

IEEE style (FP16, BF16, E5M2): f = all ones is ±Inf (t = 0) or NaN (t ≠ 0).
OCP "fn" style (E4M3, ``finite_only=True``): no Inf; f = all ones holds normal numbers too, and only
S.1111.111 is NaN — so E4M3's largest value is 1.110₂ · 2^8 = 448.

Numbers worth knowing (the seed slides-hardware-accelerators-for-training-dnns.txt, table 1, gives the
half-float maximum as 65,535; it is 65,504 = (2 − 2^−10) · 2^15):

    format   (s,e,m)   max normal   min normal   min subnormal   epsilon
    FP32     1,8,23    3.40e38      2^−126       2^−149          2^−23
    FP16     1,5,10    65504        2^−14        2^−24           2^−10
    BF16     1,8,7     3.39e38      2^−126       2^−133          2^−7
    E5M2     1,5,2     57344        2^−14        2^−16           2^−2
    E4M3fn   1,4,3     448          2^−6         2^−9            2^−3

``quantize`` (rounding into a format) lives in rounding.py and is re-exported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: 1 sign bit, ``exp_bits`` exponent bits, ``man_bits`` fraction bits.

    ``finite_only=True`` is the OCP "fn" variant (no infinity, a single NaN mantissa per sign).
    Formats must fit inside float64 (exp_bits <= 11, man_bits <= 52) so that float64 holds every value.
    """

    exp_bits: int
    man_bits: int
    finite_only: bool = False
    name: str = field(default="", compare=False)   # FloatFormat(5, 10) == FP16

    def __post_init__(self):
        for attribute in ("exp_bits", "man_bits"):
            value = getattr(self, attribute)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"FloatFormat.{attribute} must be an int, got {type(value).__name__}")
        if not 2 <= self.exp_bits <= 11:
            raise ValueError(f"FloatFormat needs 2..11 exponent bits (0 or 1 leave no normal numbers; "
                             f"more than 11 does not fit float64), got {self.exp_bits}")
        if not 1 <= self.man_bits <= 52:
            raise ValueError(f"FloatFormat needs 1..52 mantissa bits (a NaN needs one; more than 52 does "
                             f"not fit float64), got {self.man_bits}")
        if not self.name:
            object.__setattr__(self, "name", f"E{self.exp_bits}M{self.man_bits}{'fn' if self.finite_only else ''}")

    @property
    def total_bits(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def has_inf(self) -> bool:
        return not self.finite_only

    @property
    def bias(self) -> int:
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def emax(self) -> int:
        """Exponent of the largest binade: field all-ones − 1 (IEEE) or all-ones ("fn"), minus bias."""
        top_field = 2 ** self.exp_bits - 1 if self.finite_only else 2 ** self.exp_bits - 2
        return top_field - self.bias

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal binade: 1 − bias."""
        return 1 - self.bias

    @property
    def max_normal(self) -> float:
        # IEEE: 1.11…1 · 2^emax.  "fn": 1.11…10 · 2^emax (1.11…1 at the top exponent is NaN).
        top_significand = 2.0 - 2.0 ** (1 - self.man_bits) if self.finite_only else 2.0 - 2.0 ** -self.man_bits
        return math.ldexp(top_significand, self.emax)

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def min_subnormal(self) -> float:
        return math.ldexp(1.0, self.emin - self.man_bits)

    @property
    def epsilon(self) -> float:
        """Distance from 1.0 to the next larger value: 2^−man_bits."""
        return math.ldexp(1.0, -self.man_bits)

    def __repr__(self) -> str:
        return f"FloatFormat({self.name}: 1,{self.exp_bits},{self.man_bits}, max {self.max_normal:g})"


FP32 = FloatFormat(8, 23, name="FP32")
FP16 = FloatFormat(5, 10, name="FP16")
BF16 = FloatFormat(8, 7, name="BF16")
FP8_E5M2 = FloatFormat(5, 2, name="FP8_E5M2")
FP8_E4M3 = FloatFormat(4, 3, finite_only=True, name="FP8_E4M3")


def check_format(fmt) -> FloatFormat:
    if not isinstance(fmt, FloatFormat):
        raise TypeError(f"expected a FloatFormat (e.g. FP16, FP8_E5M2), got {type(fmt).__name__}")
    return fmt


def code_dtype(fmt: FloatFormat) -> type:
    """The smallest unsigned integer type that holds a bit pattern of fmt."""
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if fmt.total_bits <= 8 * np.dtype(dtype).itemsize:
            return dtype
    raise AssertionError("unreachable: formats fit in 64 bits")


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


# quantize is defined in rounding.py (which needs FloatFormat from above); re-exported here.
from .rounding import fits_in, quantize
