"""The fast path of ``quantize``: rounding on the bit patterns, with integer arithmetic.

rounding.py says *what* is computed (the readable stochastic rounding: neighbours lo <= x <= hi, up with
probability (x − lo)/(hi − lo)); this file computes the same thing in ~5 in-place integer passes, and the
tests check it against the readable version. For non-negative floats the bit patterns sort like the values,
so rounding x is rounding its magnitude bits ``mag`` (the sign bit rides along: no carry reaches it). A
float64 input is rounded once, from itself (no double rounding through float32).

M = the input's fraction bits (23 or 52), m = fmt.man_bits, d = M − m the bits to drop.

Normal range of fmt: fmt keeps every 2^d-th input value of x's binade, so
    nearest-even:  mag + (2^(d−1) − 1) + lsb, then clear the low d bits   (lsb = bit d of mag: ties → even)
    stochastic:    mag + R, R uniform on {0, …, 2^d − 1}, then clear the low d bits
(the carry happens with probability r / 2^d, r = the dropped bits: exactly (x − lo)/(hi − lo)).
A carry out of the fraction moves into the exponent field: rounding up into the next binade is free.

Below fmt.min_normal fmt's grid is uniform with quantum Q = 2^q = fmt.min_subnormal. With |x| = sig · 2^e
(integer significand sig, read off the bits) and k = q − e >= 1: |x| / Q = count + r / 2^k, count =
sig >> k, r = sig mod 2^k; nearest-even goes up iff r > 2^(k−1) (or = and count odd), stochastic iff a
uniform k-bit integer N < r (k may exceed 64: ``_uniform_below``).

Overflow (|x| > max_normal) and specials are fixed afterwards in one pass, only when min/max show any.
"""

from __future__ import annotations

import numpy as np

from .formats import HOST_FORMATS, FloatFormat

_UINT = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}
_ALL_BITS = np.uint64(2**64 - 1)


def round_bits(x: np.ndarray, fmt: FloatFormat, rounding: str, rng: np.random.Generator | None,
               saturate: bool) -> np.ndarray:
    """quantize's work for a checked float32/float64 array x (any shape): returns values of fmt, x's dtype."""
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
    uint, drop = bits.dtype.type, HOST_FORMATS[flat.dtype].man_bits - fmt.man_bits
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
    uint, drop = bits.dtype.type, HOST_FORMATS[flat.dtype].man_bits - fmt.man_bits
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
    return out


def _tiny_positions(flat: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """Indices of the non-zero inputs below fmt.min_normal, where the bit trick above is wrong.

    If fmt's exponent reaches as low as the input's (BF16 or FP32 from float32), the input's subnormals
    are spaced like fmt's subnormals and the bit trick is right for them too: nothing to do.
    """
    if fmt.emin == HOST_FORMATS[flat.dtype].emin:
        return np.empty(0, dtype=np.intp)
    below = np.flatnonzero(np.abs(flat) < fmt.min_normal)
    return below[flat[below] != 0]


def _tiny_split(bits: np.ndarray, fmt: FloatFormat, dtype
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sign, and |x| / fmt.min_subnormal = count + rest / 2^k, all integers (uint64 / int64), k >= 1."""
    host = HOST_FORMATS[np.dtype(dtype)]
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
    if isinstance(rng.bit_generator, _RAW_64):   # the raw words: cheaper than rng.integers
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
    host = HOST_FORMATS[np.dtype(f"f{bits.dtype.itemsize}")]
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
