"""quantize(x, fmt): round a float32/float64 array into a FloatFormat, exactly, with integer arithmetic.

Why integers: a float32 (or float64) is sign | exponent | fraction, and for non-negative values the bit
patterns sort like the values. Rounding x to fmt is rounding its *magnitude bits* ``mag`` (the sign bit
rides along untouched: the additions below never carry into it). We never compute with a rounded
intermediate, so a float64 input is rounded once, from itself (emulators that go float64 → float32 → fmt
round twice and get some midpoints wrong).

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

# A float dtype as a FloatFormat, and the unsigned integer type of its bit patterns.
_HOST = {np.dtype(np.float16): FloatFormat(5, 10), np.dtype(np.float32): FloatFormat(8, 23),
         np.dtype(np.float64): FloatFormat(11, 52)}
_UINT = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}
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

    flat = np.ascontiguousarray(x).reshape(-1)
    bits = flat.view(_UINT[x.dtype])   # sign | exponent | fraction, as one unsigned integer
    if rounding == "nearest":
        out = _round_nearest_even(flat, bits, fmt)
    else:
        out = _round_stochastic(flat, bits, fmt, rng)
    # |x| <= max_normal cannot round past max_normal: two cheap reductions skip the overflow pass
    if flat.size and not (-fmt.max_normal <= flat.min() and flat.max() <= fmt.max_normal):
        _overflow_and_specials(bits, out, fmt, saturate)    # some |x| > max_normal, ±Inf or NaN
    return out.view(x.dtype).reshape(x.shape)


def _round_nearest_even(flat: np.ndarray, bits: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """Bits rounded to nearest-even. The sign bit rides along: the additions never reach it."""
    uint, drop = bits.dtype.type, _HOST[flat.dtype].man_bits - fmt.man_bits
    if drop == 0:
        out = bits.copy()
    else:
        low = uint((1 << drop) - 1)
        out = bits >> uint(drop)
        out &= uint(1)                  # lsb of what is kept: a tie goes to the even neighbour
        out += bits
        out += low >> uint(1)           # + 2^(drop-1) - 1
        out &= ~low
    tiny = _tiny_positions(flat, fmt)
    if tiny.size:
        negative, count, rest, k = _tiny_split(bits[tiny], fmt, flat.dtype)
        kk = np.minimum(k, 63).astype(np.uint64)   # k >= 63 leaves rest < 2^53 < half: rounds down
        half = np.uint64(1) << (kk - np.uint64(1))
        up = (rest > half) | ((rest == half) & (count & np.uint64(1) == 1))
        out[tiny] = _tiny_bits(negative, count + up, fmt, flat.dtype)
    return out


def _round_stochastic(flat: np.ndarray, bits: np.ndarray, fmt: FloatFormat, rng: np.random.Generator
                      ) -> np.ndarray:
    """Bits rounded up with probability (dropped bits) / 2^(their number); see the module docstring."""
    # BEGIN SOLUTION stochastic_rounding
    uint, drop = bits.dtype.type, _HOST[flat.dtype].man_bits - fmt.man_bits
    if drop == 0:
        out = bits.copy()
    else:
        # carry into the kept bits iff noise >= 2^drop - dropped: probability dropped / 2^drop
        out = _random_integers(rng, bits.size, drop, uint)
        out += bits
        out &= ~uint((1 << drop) - 1)
    tiny = _tiny_positions(flat, fmt)
    if tiny.size:
        negative, count, rest, k = _tiny_split(bits[tiny], fmt, flat.dtype)
        up = _uniform_below(rest, k, rng)   # P(up) = rest / 2^k exactly
        out[tiny] = _tiny_bits(negative, count + up, fmt, flat.dtype)
    # END SOLUTION
    return out


def _tiny_positions(flat: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """Indices of the non-zero inputs below fmt.min_normal, where the bit trick above is wrong.

    If fmt's exponent reaches as low as the input's (BF16 or FP32 from float32), the input's subnormals
    are spaced like fmt's subnormals and the bit trick is right for them too: nothing to do.
    """
    if fmt.emin == _HOST[flat.dtype].emin:
        return np.empty(0, dtype=np.intp)
    below = np.flatnonzero(np.abs(flat) < fmt.min_normal)
    return below[flat[below] != 0]


def _tiny_split(bits: np.ndarray, fmt: FloatFormat, dtype
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sign, and |x| / fmt.min_subnormal = count + rest / 2^k, all integers (uint64 / int64), k >= 1."""
    host = _HOST[np.dtype(dtype)]
    bits = bits.astype(np.uint64)
    negative = (bits >> np.uint64(host.total_bits - 1)).astype(bool)
    field = (bits >> np.uint64(host.man_bits)) & np.uint64((1 << host.exp_bits) - 1)
    fraction = bits & np.uint64((1 << host.man_bits) - 1)
    significand = np.where(field > 0, fraction | np.uint64(1 << host.man_bits), fraction)
    exponent = np.maximum(field.astype(np.int64), 1) - host.bias - host.man_bits   # |x| = sig · 2^exponent
    k = (fmt.emin - fmt.man_bits) - exponent
    kk = np.minimum(k, 63).astype(np.uint64)    # sig < 2^53, so for k >= 63 count = 0 and rest = sig
    return negative, significand >> kk, significand & ((np.uint64(1) << kk) - np.uint64(1)), k


def _tiny_bits(negative: np.ndarray, count: np.ndarray, fmt: FloatFormat, dtype) -> np.ndarray:
    """±count · fmt.min_subnormal (a value of fmt, so exact in float64 and in dtype) as dtype's bits."""
    value = np.ldexp(count.astype(np.float64), fmt.emin - fmt.man_bits)
    value = np.where(negative, -value, value)
    return value.astype(dtype).view(_UINT[np.dtype(dtype)])


# Bit generators whose raw outputs are 64 random bits (MT19937's are 32 bits).
_RAW_64 = (np.random.PCG64, np.random.PCG64DXSM, np.random.Philox, np.random.SFC64)


def _random_integers(rng: np.random.Generator, n: int, nbits: int, uint) -> np.ndarray:
    """n integers uniform on {0, …, 2^nbits − 1}, as uint: the top nbits of uniformly random words."""
    width = 8 * np.dtype(uint).itemsize
    if isinstance(rng.bit_generator, _RAW_64):   # the raw words: ~2x faster than rng.integers
        words = rng.bit_generator.random_raw(-(-n * width // 64)).view(uint)[:n]
    else:
        words = rng.integers(0, np.iinfo(uint).max, size=n, dtype=uint, endpoint=True)
    words >>= uint(width - nbits)
    return words


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


def _overflow_and_specials(bits: np.ndarray, out: np.ndarray, fmt: FloatFormat, saturate: bool) -> None:
    """Fix, in place, the results of inputs beyond max_normal: overflow, ±Inf and NaN inputs."""
    uint = bits.dtype.type
    host = _HOST[np.dtype(f"f{bits.dtype.itemsize}")]
    sign_bit = uint(1 << (host.total_bits - 1))
    max_bits = np.array(fmt.max_normal, dtype=f"f{bits.dtype.itemsize}").view(uint)
    inf_bits = uint(((1 << host.exp_bits) - 1) << host.man_bits)
    nan_bits = inf_bits | uint(1 << (host.man_bits - 1))
    magnitude = bits & ~sign_bit
    flagged = np.flatnonzero(magnitude > max_bits)
    source, rounded = magnitude[flagged], out[flagged] & ~sign_bit
    overflow = max_bits if saturate else (inf_bits if fmt.has_inf else nan_bits)
    infinite = inf_bits if fmt.has_inf else overflow
    fixed = np.where(source > inf_bits, source,                      # NaN stays NaN
                     np.where(source == inf_bits, infinite,
                              np.where(rounded > max_bits, overflow, rounded)))
    out[flagged] = fixed | (bits[flagged] & sign_bit)


def _check_input(x) -> np.ndarray:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (float, np.floating, np.ndarray)):
        raise TypeError(f"quantize expects a float16/32/64 numpy array, got {type(x).__name__}")
    x = np.asarray(x)
    if x.dtype not in _HOST:
        raise TypeError(f"quantize expects a float16/32/64 array, got dtype {x.dtype}")
    return x
