"""Binary floating-point formats (FP32, FP16, BF16, FP8): what a format is, and its numbers.

A format with E exponent bits and M mantissa (fraction) bits stores sign s, exponent field f and
fraction bits t as

    normal     (0 < f < all ones):  (−1)^s · 1.t · 2^(f − bias)           bias = 2^(E−1) − 1
    subnormal  (f = 0):             (−1)^s · 0.t · 2^(1 − bias)

IEEE style (FP16, BF16, E5M2): f = all ones is ±Inf (t = 0) or NaN (t ≠ 0).
OCP "fn" style (E4M3, ``finite_only=True``): no Inf; f = all ones holds normal numbers too, and only
S.1111.111 is NaN — so E4M3's largest value is 1.110₂ · 2^8 = 448.

Numbers worth knowing (the "Hardware Accelerators for Training DNNs" slides, table 1, give the half-float
maximum as 65,535; it is 65,504 = (2 − 2^−10) · 2^15):

    format   (s,e,m)   max normal   min normal   min subnormal   epsilon
    FP32     1,8,23    3.40e38      2^−126       2^−149          2^−23
    FP16     1,5,10    65504        2^−14        2^−24           2^−10
    BF16     1,8,7     3.39e38      2^−126       2^−133          2^−7
    E5M2     1,5,2     57344        2^−14        2^−16           2^−2
    E4M3fn   1,4,3     448          2^−6         2^−9            2^−3

Rounding into a format is rounding.py (``quantize``); bit patterns are bits.py (``encode``/``decode``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


def check_flag(value, name: str) -> bool:
    """A yes/no option must be True or False: "no" or 1 would silently count as True (or False)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


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
        check_flag(self.finite_only, "FloatFormat.finite_only")
        if not 2 <= self.exp_bits <= 11:
            raise ValueError(f"FloatFormat needs 2..11 exponent bits (0 or 1 leave no normal numbers; "
                             f"more than 11 does not fit float64), got {self.exp_bits}")
        if not 1 <= self.man_bits <= 52:
            raise ValueError(f"FloatFormat needs 1..52 mantissa bits (a NaN needs one; more than 52 does "
                             f"not fit float64), got {self.man_bits}")
        if not self.name:
            object.__setattr__(
                self, "name", f"E{self.exp_bits}M{self.man_bits}{'fn' if self.finite_only else ''}"
            )

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
        top_significand = 2.0 - 2.0 ** (1 - self.man_bits) if self.finite_only else 2.0 - 2.0**-self.man_bits
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


# The host float dtypes as formats: the rounding code reads their bits with these parameters.
HOST_FORMATS = {np.dtype(np.float16): FloatFormat(5, 10), np.dtype(np.float32): FloatFormat(8, 23),
                np.dtype(np.float64): FloatFormat(11, 52)}


def fits_in(fmt: FloatFormat, dtype) -> bool:
    """True if every value of fmt is exactly a value of the float dtype (float16/32/64)."""
    host = HOST_FORMATS[np.dtype(dtype)]
    return (fmt.man_bits <= host.man_bits and fmt.emax <= host.emax
            and fmt.emin - fmt.man_bits >= host.emin - host.man_bits)

