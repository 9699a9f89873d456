"""Rounding a float array into a FloatFormat: round-to-nearest-even and stochastic rounding.

Every finite x lies between two neighbouring values of the format, lo <= x < hi = lo + spacing, where the
spacing of fmt's values is 2^(e − m) in the binade 2^e <= |x| < 2^(e+1) (m = fmt.man_bits) and the
subnormal quantum 2^(emin − m) below fmt.min_normal.

    nearest-even:  the nearer of lo and hi; on a tie the one whose last fraction bit is 0
    stochastic:    hi with probability p = (x − lo) / (hi − lo), else lo

Stochastic rounding is unbiased: E[round(x)] = lo + p · (hi − lo) = x. Small updates therefore survive
on average where round-to-nearest would lose every one of them (Gupta et al. 2015, "Deep Learning with
Limited Numerical Precision"; the FP8 training paper of the "Hardware Accelerators" slides rounds its
weight updates this way). A representable x has p = 0 and never moves.

``stochastic_round`` below is that definition, in float64 and readable; ``quantize`` computes the same
distribution with bit operations (fast_rounding.py), checked against it in the tests.

Overflow (|x| > max_normal): ±Inf in IEEE formats, NaN in the "fn" formats (no Inf), ±max_normal with
``saturate=True``. An infinite input stays infinite in IEEE formats; NaN stays NaN. Without an rng,
stochastic rounding raises ValueError: minidist never draws hidden random numbers.
"""

from __future__ import annotations

import numpy as np

from .fast_rounding import round_bits
from .formats import HOST_FORMATS, FloatFormat, check_flag, check_format, fits_in

ROUNDINGS = ("nearest", "stochastic")


def quantize(x: np.ndarray, fmt: FloatFormat, rounding: str = "nearest",
             rng: np.random.Generator | None = None, saturate: bool = False) -> np.ndarray:
    """Round x to a value of fmt. x: float16/32/64 array, any shape; returns an array of x's shape and
    dtype whose values are exactly representable in fmt.

    rounding="nearest": round to nearest, ties to even, correctly rounded from x itself.
    rounding="stochastic": lo or hi with P(hi) = (x − lo)/(hi − lo) exactly; needs ``rng`` (a numpy
    Generator). Same rng state, same result. saturate=True: overflow gives ±fmt.max_normal.
    """
    x = _check_options(x, fmt, rounding, rng, saturate)
    if x.dtype == np.float16:  # float16 -> float32 is exact, and so is the way back since fmt fits float16
        return quantize(x.astype(np.float32), fmt, rounding, rng, saturate).astype(np.float16)
    return round_bits(x, fmt, rounding, rng, saturate)


def stochastic_round(x: np.ndarray, fmt: FloatFormat, rng: np.random.Generator,
                     saturate: bool = False) -> np.ndarray:
    """The readable stochastic rounding. x: float16/32/64 array, any shape; returns an array of x's shape
    and dtype, each element lo or hi (its neighbours in fmt) with P(hi) = (x − lo)/(hi − lo) exactly.

    Same distribution as ``quantize(x, fmt, "stochastic", rng, saturate)`` (not the same draws).
    """
    x = _check_options(x, fmt, "stochastic", rng, saturate)
    values = x.astype(np.float64)    # exact; every value of fmt is a float64 too
    with np.errstate(invalid="ignore"):  # Inf and NaN inputs pass through here and are fixed below
        # BEGIN SOLUTION stochastic_rounding
        _, e = np.frexp(values)                  # |x| = f · 2^e with 0.5 <= f < 1: x's binade is 2^(e−1)
        spacing = np.ldexp(1.0, np.maximum(e - 1, fmt.emin) - fmt.man_bits)  # hi − lo, a power of two
        lo = np.floor(values / spacing) * spacing                      # the neighbour below (toward −∞)
        p_up = (values - lo) / spacing           # (x − lo)/(hi − lo), exact: a power-of-two division
        rounded = np.where(bernoulli(p_up, rng), lo + spacing, lo)
        # END SOLUTION
    rounded = np.copysign(rounded, values)       # −0.0 stays −0.0; a tiny negative x rounds to −0.0
    return _overflow(values, rounded, fmt, saturate).astype(x.dtype)


def bernoulli(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Booleans, True with probability exactly p (float64 array, values in [0, 1)).

    ``rng.random() < p`` is not exact: its uniform u has 53 bits, so p = 2^−70 would never come up. Here u
    is compared with p 53 bits at a time: draw the next 53 bits of u; smaller than p's next 53 bits →
    True, larger → False, equal (probability 2^−53) → look at the following 53 bits. p is a float64, so
    its bits end after at most 21 rounds.
    """
    rest = np.array(p, dtype=np.float64)         # the part of p not compared yet, scaled to [0, 1)
    up = np.zeros(rest.shape, dtype=bool)
    undecided = np.flatnonzero(rest > 0)
    while undecided.size:
        p_bits = np.floor(np.ldexp(rest.flat[undecided], 53))         # next 53 bits of p, an integer
        u_bits = rng.integers(0, 2**53, size=undecided.size).astype(np.float64)
        up.flat[undecided] = u_bits < p_bits
        rest.flat[undecided] = np.ldexp(rest.flat[undecided], 53) - p_bits   # exact
        tie = (u_bits == p_bits) & (rest.flat[undecided] > 0)
        undecided = undecided[tie]
    return up


def _overflow(values: np.ndarray, rounded: np.ndarray, fmt: FloatFormat, saturate: bool) -> np.ndarray:
    """Results beyond max_normal: ±Inf (IEEE), NaN ("fn") or ±max_normal (saturate); Inf inputs stay
    infinite in IEEE formats; NaN stays NaN."""
    too_big = np.abs(rounded) > fmt.max_normal   # NaN compares False: NaN stays NaN
    overflow = fmt.max_normal if saturate else (np.inf if fmt.has_inf else np.nan)
    out = np.where(too_big, np.copysign(overflow, values), rounded)
    if fmt.has_inf:
        out = np.where(np.isinf(values), values, out)
    return out


def _check_options(x, fmt, rounding, rng, saturate) -> np.ndarray:
    """x as a float16/32/64 array, after checking every option (TypeError / ValueError)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (float, np.floating, np.ndarray)):
        raise TypeError(f"quantize expects a float16/32/64 numpy array, got {type(x).__name__}")
    x = np.asarray(x)
    if x.dtype not in HOST_FORMATS:
        raise TypeError(f"quantize expects a float16/32/64 array, got dtype {x.dtype}")
    check_format(fmt)
    check_flag(saturate, "saturate")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if rounding == "stochastic" and rng is None:
        raise ValueError("stochastic rounding needs rng=np.random.default_rng(seed) "
                         "(minidist never draws hidden random numbers)")
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if not fits_in(fmt, x.dtype):
        raise ValueError(f"{fmt.name} values are not all representable in {x.dtype}; "
                         f"pass a float32 or float64 array")
    return x
