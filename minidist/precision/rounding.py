"""quantize(x, fmt): round a float32/float64 array into a FloatFormat, exactly, with integer arithmetic.

Why integers: a float32 (or float64) is sign | exponent | fraction, and for non-negative values the bit
patterns sort like the values. Rounding x to fmt is rounding its *magnitude bits* ``mag``; we never
compute with a rounded intermediate, so a float64 input is rounded once, from itself (emulators that go
float64 → float32 → fmt round twice and get some midpoints wrong).

Let M be the input's fraction bits (23 or 52), m = fmt.man_bits, d = M − m the bits to drop.

Normal range of fmt (|x| >= fmt.min_normal). In x's binade fmt keeps every 2^d-th input value, so:
    nearest-even:  mag + (2^(d−1) − 1) + lsb, then clear the low d bits   (lsb = bit d of mag: ties → even)
    stochastic:    mag + R, R uniform on {0, …, 2^d − 1}, then clear the low d bits
A carry out of the fraction moves into the exponent field: rounding up into the next binade is free.

Tiny range (|x| < fmt.min_normal: fmt's subnormals, and below its smallest subnormal). fmt's grid is
uniform with quantum Q = fmt.min_subnormal = 2^q. Write |x| = sig · 2^e with an integer significand sig
(exact: it is read off the bits); with k = q − e >= 1,
    |x| / Q = count + r / 2^k,     count = sig >> k,   r = sig mod 2^k.
    nearest-even:  up  ⇔  r > 2^(k−1), or r = 2^(k−1) and count is odd
    stochastic:    up  ⇔  N < r for N uniform on {0, …, 2^k − 1}     (k may exceed 64: _uniform_below)

Stochastic rounding is exactly unbiased. In both ranges x = lo + (r / 2^k)·(hi − lo), where lo, hi are
x's neighbours in fmt, r the dropped bits and k their number (k = d in the normal range); and we round
up exactly when a uniform k-bit integer falls below r — probability r / 2^k, a ratio of integers with no
floating-point rounding in between. So E[quantize(x)] = lo + (r/2^k)(hi − lo) = x. A representable x
has r = 0 and never moves; the result is always lo or hi. (Beyond max_normal hi does not exist: values
there overflow as below, so unbiasedness holds for |x| <= max_normal.)

Overflow: to ±Inf (IEEE formats), to NaN (the "fn" formats, which have no Inf), or to ±max_normal with
``saturate=True``. An infinite input stays infinite in IEEE formats (Inf is representable); in "fn"
formats it becomes NaN (or ±max with saturate). NaN stays NaN.

Without an rng, stochastic rounding raises ValueError: minidist never draws hidden random numbers.
"""

from __future__ import annotations

import numpy as np

from .formats import FloatFormat, check_format

ROUNDINGS = ("nearest", "stochastic")

# A float dtype as a FloatFormat, and its (unsigned view, exponent bits, fraction bits).
_HOST = {np.dtype(np.float16): FloatFormat(5, 10), np.dtype(np.float32): FloatFormat(8, 23),
         np.dtype(np.float64): FloatFormat(11, 52)}
_LAYOUT = {np.dtype(np.float32): (np.uint32, 8, 23), np.dtype(np.float64): (np.uint64, 11, 52)}
_ALL_BITS = np.uint64(2**64 - 1)


def fits_in(fmt: FloatFormat, dtype) -> bool:
    """True if every value of fmt is exactly a value of the float dtype (float16/32/64)."""
    host = _HOST[np.dtype(dtype)]
    return (fmt.man_bits <= host.man_bits and fmt.emax <= host.emax
            and fmt.emin - fmt.man_bits >= host.emin - host.man_bits)


def quantize(x: np.ndarray, fmt: FloatFormat, rounding: str = "nearest",
             rng: np.random.Generator | None = None, saturate: bool = False) -> np.ndarray:
    """Round x (float16/32/64, any shape) to the nearest value of fmt; returns an array of x's dtype.

    rounding="nearest": round to nearest, ties to even, correctly rounded from x itself.
    rounding="stochastic": round to the lower or upper neighbour lo <= x <= hi with
    P(hi) = (x − lo)/(hi − lo) exactly; needs ``rng`` (a numpy Generator). Same rng state, same result.
    saturate=True: overflow gives ±fmt.max_normal instead of ±Inf (or NaN for E4M3).
    """
    x = _check_input(x)
    check_format(fmt)
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
    if x.dtype == np.float16:  # float16 -> float32 is exact, and so is the way back since fmt fits float16
        return quantize(x.astype(np.float32), fmt, rounding, rng, saturate).astype(np.float16)

    uint, exp_bits, man_bits = _LAYOUT[x.dtype]
    bits = np.ascontiguousarray(x).reshape(-1).view(uint)
    sign = bits & uint(1 << (exp_bits + man_bits))
    mag = bits ^ sign
    if rounding == "nearest":
        out = _round_nearest_even(mag, fmt, x.dtype)
    else:
        out = _round_stochastic(mag, fmt, x.dtype, rng)
    _overflow_and_specials(mag, out, fmt, x.dtype, saturate)
    out |= sign
    return out.view(x.dtype).reshape(x.shape)


def _round_nearest_even(mag: np.ndarray, fmt: FloatFormat, dtype) -> np.ndarray:
    uint, _, man_bits = _LAYOUT[dtype]
    drop = man_bits - fmt.man_bits
    out = mag.copy()
    if drop:
        low = uint((1 << drop) - 1)
        out >>= uint(drop)
        out &= uint(1)                  # lsb of what is kept: a tie goes to the even neighbour
        out += mag
        out += low >> uint(1)           # + 2^(drop-1) - 1
        out &= ~low
    tiny = _tiny_positions(mag, fmt, dtype)
    if tiny.size:
        count, rest, k = _tiny_split(mag[tiny], fmt, dtype)
        kk = np.minimum(k, 63).astype(np.uint64)   # k >= 63 leaves rest < 2^53 < half: rounds down
        half = np.uint64(1) << (kk - np.uint64(1))
        up = (rest > half) | ((rest == half) & (count & np.uint64(1) == 1))
        out[tiny] = _tiny_bits(count + up, fmt, dtype)
    return out


def _round_stochastic(mag: np.ndarray, fmt: FloatFormat, dtype, rng: np.random.Generator) -> np.ndarray:
    """Magnitude bits rounded up with probability (dropped bits)/2^(their number); see the module doc."""
    # BEGIN SOLUTION stochastic_rounding
    uint, _, man_bits = _LAYOUT[dtype]
    drop = man_bits - fmt.man_bits
    out = mag.copy()
    if drop:
        # carry into the kept bits iff noise >= 2^drop - dropped, i.e. with probability dropped / 2^drop
        out += rng.integers(0, 1 << drop, size=mag.size, dtype=uint)
        out &= ~uint((1 << drop) - 1)
    tiny = _tiny_positions(mag, fmt, dtype)
    if tiny.size:
        count, rest, k = _tiny_split(mag[tiny], fmt, dtype)
        up = _uniform_below(rest, k, rng)   # P(up) = rest / 2^k exactly
        out[tiny] = _tiny_bits(count + up, fmt, dtype)
    # END SOLUTION
    return out


def _tiny_positions(mag: np.ndarray, fmt: FloatFormat, dtype) -> np.ndarray:
    """Indices of the non-zero inputs below fmt.min_normal — where the normal-range bit trick is wrong."""
    host = _HOST[np.dtype(dtype)]
    if fmt.emin - fmt.man_bits == host.emin - host.man_bits:
        return np.empty(0, dtype=np.intp)   # fmt has the input's own subnormals: nothing to round
    min_normal_bits = np.array(fmt.min_normal, dtype=dtype).view(mag.dtype)
    return np.flatnonzero((mag != 0) & (mag < min_normal_bits))


def _tiny_split(mag: np.ndarray, fmt: FloatFormat, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """|x| / fmt.min_subnormal = count + rest / 2^k, all integers (uint64, uint64, int64), k >= 1."""
    host = _HOST[np.dtype(dtype)]
    mag = mag.astype(np.uint64)
    field = mag >> np.uint64(host.man_bits)
    fraction = mag & np.uint64((1 << host.man_bits) - 1)
    significand = np.where(field > 0, fraction | np.uint64(1 << host.man_bits), fraction)
    exponent = np.maximum(field.astype(np.int64), 1) - host.bias - host.man_bits   # |x| = sig · 2^exponent
    k = (fmt.emin - fmt.man_bits) - exponent
    kk = np.minimum(k, 63).astype(np.uint64)    # sig < 2^53, so for k >= 63 count = 0 and rest = sig
    return significand >> kk, significand & ((np.uint64(1) << kk) - np.uint64(1)), k


def _tiny_bits(count: np.ndarray, fmt: FloatFormat, dtype) -> np.ndarray:
    """count · fmt.min_subnormal (a value of fmt, so exact in float64 and in dtype) as dtype's bits."""
    value = np.ldexp(count.astype(np.float64), fmt.emin - fmt.man_bits)
    return value.astype(dtype).view(_LAYOUT[np.dtype(dtype)][0])


def _uniform_below(rest: np.ndarray, k: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Booleans, True with probability rest / 2^k exactly (rest < 2^64, k >= 1, k may exceed 64).

    N uniform on {0, …, 2^k − 1} is N_high · 2^64 + N_low; N < rest ⇔ N_low < rest and N_high = 0.
    N_low uses the top min(k, 64) bits of one random word; N_high's k − 64 bits are drawn 64 at a time,
    only for the (rare: probability 2^−64 per word) elements still undecided.
    """
    low_bits = np.minimum(k, 64).astype(np.uint64)
    word = rng.integers(0, _ALL_BITS, size=rest.size, dtype=np.uint64, endpoint=True)
    below = (word >> (np.uint64(64) - low_bits)) < rest
    high_bits = k - low_bits.astype(np.int64)
    pending = np.flatnonzero(below & (high_bits > 0))
    while pending.size:
        take = np.minimum(high_bits[pending], 64).astype(np.uint64)
        word = rng.integers(0, _ALL_BITS, size=pending.size, dtype=np.uint64, endpoint=True)
        below[pending] = (word >> (np.uint64(64) - take)) == 0
        high_bits[pending] -= take.astype(np.int64)
        pending = pending[below[pending] & (high_bits[pending] > 0)]
    return below


def _overflow_and_specials(mag: np.ndarray, out: np.ndarray, fmt: FloatFormat, dtype,
                           saturate: bool) -> None:
    """Fix, in place, every result above fmt.max_normal: overflow, and Inf/NaN inputs."""
    uint, exp_bits, man_bits = _LAYOUT[dtype]
    max_bits = np.array(fmt.max_normal, dtype=dtype).view(uint)
    inf_bits = uint(((1 << exp_bits) - 1) << man_bits)
    nan_bits = inf_bits | uint(1 << (man_bits - 1))
    flagged = np.flatnonzero(out > max_bits)   # Inf/NaN inputs are among them too
    if not flagged.size:
        return
    source = mag[flagged]
    overflow = max_bits if saturate else (inf_bits if fmt.has_inf else nan_bits)
    infinite = inf_bits if fmt.has_inf else overflow
    out[flagged] = np.where(source > inf_bits, source, np.where(source == inf_bits, infinite, overflow))


def _check_input(x) -> np.ndarray:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (float, np.floating, np.ndarray)):
        raise TypeError(f"quantize expects a float16/32/64 numpy array, got {type(x).__name__}")
    x = np.asarray(x)
    if x.dtype not in _HOST:
        raise TypeError(f"quantize expects a float16/32/64 array, got dtype {x.dtype}")
    return x
