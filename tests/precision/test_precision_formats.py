"""Formats, round-to-nearest-even and bit patterns: exhaustive where the format is small.

Oracles: numpy's float16 casts (correctly rounded from float32 and from float64), an independent
brute-force nearest-value search over the 256 decoded FP8 codes, and ml_dtypes on float32 input.
"""

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.precision import BF16, FP8_E4M3, FP8_E5M2, FP16, FP32, FloatFormat, decode, encode, quantize

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")

FP8_FORMATS = [FP8_E5M2, FP8_E4M3]
UINT = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: equal bit patterns (so −0 ≠ +0), or both NaN."""
    return (a.view(UINT[a.dtype]) == b.view(UINT[b.dtype])) | (np.isnan(a) & np.isnan(b))


def fp16_values_and_midpoints() -> tuple[np.ndarray, np.ndarray]:
    values = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float64)
    finite = np.unique(values[np.isfinite(values)])                  # sorted; +0 and −0 merge
    return values, (finite[:-1] + finite[1:]) / 2                     # midpoints are exact in float64


def test_format_constants():
    assert (FP16.max_normal, FP16.min_normal, FP16.min_subnormal) == (65504.0, 2.0**-14, 2.0**-24)
    assert (FP8_E5M2.max_normal, FP8_E5M2.min_normal, FP8_E5M2.min_subnormal) == (57344.0, 2.0**-14, 2.0**-16)
    assert (FP8_E4M3.max_normal, FP8_E4M3.min_normal, FP8_E4M3.min_subnormal) == (448.0, 2.0**-6, 2.0**-9)
    for fmt, dtype in ((FP16, np.float16), (FP32, np.float32)):
        info = np.finfo(dtype)
        assert fmt.max_normal == float(info.max) and fmt.epsilon == float(info.eps)
        assert fmt.min_normal == float(info.smallest_normal)
        assert fmt.min_subnormal == float(info.smallest_subnormal)
    assert BF16.bias == 127 and FP16.bias == 15 and FP8_E4M3.bias == 7
    assert FP8_E4M3.total_bits == 8 and not FP8_E4M3.has_inf and FP8_E5M2.has_inf
    assert FloatFormat(5, 10) == FP16 and FloatFormat(4, 3) != FP8_E4M3      # "fn" is a different format


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fp16_every_pattern_and_midpoint_matches_numpy(dtype):
    values, midpoints = fp16_values_and_midpoints()
    for x in (values.astype(dtype), midpoints.astype(dtype)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = x.astype(np.float16).astype(dtype)
        assert same_bits(quantize(x, FP16), expected).all()
    # every representable value stays put, bit for bit (−0 included)
    assert same_bits(quantize(values.astype(dtype), FP16), values.astype(dtype)).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fp16_neighbours_of_midpoints(dtype):
    _, midpoints = fp16_values_and_midpoints()
    mid = midpoints.astype(dtype)
    for x in (np.nextafter(mid, dtype(np.inf)), np.nextafter(mid, dtype(-np.inf))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = x.astype(np.float16).astype(dtype)
        assert same_bits(quantize(x, FP16), expected).all()


def test_float64_input_is_not_double_rounded():
    """Just above an FP16 midpoint, float64 → float32 lands *on* the midpoint, which then ties to even."""
    values, midpoints = fp16_values_and_midpoints()
    finite = np.unique(values[np.isfinite(values)])
    upper = finite[1:]
    x = np.nextafter(midpoints, np.inf)                               # float64, just above the midpoint
    correct = quantize(x, FP16)
    assert (correct == upper).all()
    double_rounded = quantize(x.astype(np.float32), FP16).astype(np.float64)
    wrong = double_rounded != upper
    assert wrong.sum() > 1000            # the trap is real: half the midpoints go down that way
    assert (quantize(x, FP16)[wrong] == upper[wrong]).all()


def fp8_table(fmt: FloatFormat) -> tuple[np.ndarray, np.ndarray]:
    """The non-negative finite values of fmt, sorted, with their codes."""
    codes = np.arange(128, dtype=np.uint8)
    values = decode(codes, fmt)
    finite = np.isfinite(values)
    return values[finite], codes[finite]          # codes 0..127 already increase with the value


def brute_force_nearest_even(x: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """Nearest value of fmt by exhaustive search; ties to the even code; overflow to Inf/NaN."""
    values, codes = fp8_table(fmt)
    # past max_normal the grid continues with the top binade's spacing: one more (virtual) value, whose
    # code is even for E5M2 (0x7C, Inf: a tie goes there) and odd for E4M3 (0x7F, NaN: a tie stays)
    step = values[-1] - values[-2]
    grid = np.concatenate([values, [values[-1] + step]])
    grid_codes = np.concatenate([codes, [codes[-1] + 1]])
    magnitude = np.abs(x)
    distance = np.abs(magnitude[:, None] - grid[None, :])
    candidates = distance == distance.min(axis=1, keepdims=True)
    even = candidates & (grid_codes % 2 == 0)[None, :]
    pick = np.where(even.any(axis=1), np.argmax(even, axis=1), np.argmax(candidates, axis=1))
    result = grid[pick]
    too_big = (result > fmt.max_normal) | (magnitude > grid[-1])
    result = np.where(too_big, np.inf if fmt.has_inf else np.nan, result)
    return np.copysign(result, x)


@pytest.mark.parametrize("fmt", FP8_FORMATS, ids=lambda f: f.name)
def test_fp8_codes_midpoints_and_their_float32_neighbours(fmt):
    values, _ = fp8_table(fmt)
    extended = np.concatenate([values, [values[-1] + (values[-1] - values[-2])]])
    midpoints = (extended[:-1] + extended[1:]) / 2
    mid32 = midpoints.astype(np.float32)
    assert (mid32 == midpoints).all()
    cases = np.concatenate([values, midpoints, np.nextafter(mid32, np.float32(np.inf)),
                            np.nextafter(mid32, np.float32(-np.inf))]).astype(np.float32)
    cases = np.concatenate([cases, -cases])
    expected = brute_force_nearest_even(cases.astype(np.float64), fmt).astype(np.float32)
    got = quantize(cases, fmt)
    assert same_bits(got, expected).all(), cases[~same_bits(got, expected)][:5]
    got64 = quantize(cases.astype(np.float64), fmt)
    assert same_bits(got64, expected.astype(np.float64)).all()


@pytest.mark.parametrize("fmt", FP8_FORMATS, ids=lambda f: f.name)
def test_fp8_encode_decode_round_trip(fmt):
    codes = np.arange(256, dtype=np.uint8)
    values = decode(codes, fmt)
    nan = np.isnan(values)
    assert nan.sum() == (6 if fmt.has_inf else 2)                    # E5M2: 3 per sign; E4M3: S.1111.111
    assert (encode(values[~nan], fmt) == codes[~nan]).all()
    assert encode(values, fmt).dtype == np.uint8
    assert np.isnan(decode(encode(np.array([np.nan]), fmt), fmt)).all()
    if fmt.has_inf:
        assert (decode(np.array([0x7C, 0xFC]), fmt) == [np.inf, -np.inf]).all()
    else:
        assert encode(np.array([np.inf]), fmt)[0] == 0x7F             # no Inf: overflow is NaN


def test_fp16_encode_decode_round_trip_and_numpy_layout():
    codes = np.arange(2**16, dtype=np.uint16)
    values = decode(codes, FP16)
    assert same_bits(values, codes.view(np.float16).astype(np.float64)).all()
    finite_or_inf = ~np.isnan(values)
    assert (encode(values[finite_or_inf], FP16) == codes[finite_or_inf]).all()
    assert (encode(np.array([np.nan, -np.nan]), FP16)
            == np.array([np.nan, -np.nan]).astype(np.float16).view(np.uint16)).all()


def test_fp32_encode_is_the_float32_bit_pattern(rng):
    x = (rng.standard_normal(1000) * 10.0 ** rng.integers(-40, 38, 1000)).astype(np.float32)
    assert (encode(x, FP32) == x.view(np.uint32)).all()
    assert same_bits(decode(encode(x, FP32), FP32, dtype=np.float32), x).all()


@pytest.mark.parametrize("name,fmt", [("bfloat16", BF16), ("float8_e5m2", FP8_E5M2),
                                      ("float8_e4m3fn", FP8_E4M3)])
def test_against_ml_dtypes_on_float32(name, fmt, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    target = getattr(ml_dtypes, name)
    random_bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    spread = (rng.standard_normal(200_000) * 2.0 ** rng.integers(-30, 20, 200_000)).astype(np.float32)
    for x in (random_bits, spread):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = x.astype(target).astype(np.float32)
        assert same_bits(quantize(x, fmt), expected).all()
    codes = np.arange(2**fmt.total_bits, dtype=np.uint16 if fmt.total_bits == 16 else np.uint8)
    assert same_bits(decode(codes, fmt), codes.view(target).astype(np.float64)).all()


def test_overflow_saturation_nan_and_infinity():
    x = np.array([65504.0, 65519.0, 65520.0, 1e6, np.inf, -np.inf, np.nan, -1e6], dtype=np.float32)
    assert np.array_equal(quantize(x, FP16), [65504, 65504, np.inf, np.inf, np.inf, -np.inf, np.nan, -np.inf],
                          equal_nan=True)
    assert np.array_equal(quantize(x, FP16, saturate=True),
                          [65504, 65504, 65504, 65504, np.inf, -np.inf, np.nan, -65504], equal_nan=True)
    y = np.array([448.0, 464.0, 465.0, np.inf, -1e4], dtype=np.float32)   # 464 ties to 448 (even)
    assert np.array_equal(quantize(y, FP8_E4M3), [448, 448, np.nan, np.nan, np.nan], equal_nan=True)
    assert np.array_equal(quantize(y, FP8_E4M3, saturate=True), [448, 448, 448, 448, -448])
    assert np.array_equal(quantize(np.array([61439.0, 61440.0]), FP8_E5M2), [57344, np.inf])


@given(st.lists(st.floats(allow_nan=False, width=64), min_size=1, max_size=50),
       st.sampled_from([FP16, BF16, FP8_E5M2, FP8_E4M3, FloatFormat(6, 9), FloatFormat(3, 2)]))
def test_result_is_representable_and_nearest(values, fmt):
    x = np.array(values)
    q = quantize(x, fmt, saturate=True)
    finite = np.isfinite(x)
    assert same_bits(quantize(q, fmt, saturate=True), q).all()                  # idempotent
    assert same_bits(decode(encode(q[finite], fmt), fmt), q[finite]).all()       # a real fmt value
    # no value of fmt lies closer than q: compare with q's two neighbours (codes ±1 of |q|)
    inside = finite & (np.abs(x) <= fmt.max_normal)
    code = encode(np.abs(q[inside]), fmt).astype(np.int64)
    above = decode(code + 1, fmt)
    below = decode(np.maximum(code - 1, 0), fmt)
    error = np.abs(np.abs(x[inside]) - np.abs(q[inside]))
    assert (error <= np.abs(np.abs(x[inside]) - below)).all()
    assert (np.isnan(above) | (error <= np.abs(np.abs(x[inside]) - above))).all()   # E4M3: 448's next is NaN



def test_shapes_dtypes_and_scalars():
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    assert quantize(x, FP16).shape == (2, 3, 4) and quantize(x, FP16).dtype == np.float32
    assert quantize(x.astype(np.float16), FP8_E4M3).dtype == np.float16
    assert quantize(0.1, BF16).dtype == np.float64 and float(quantize(0.1, BF16)) == 0.10009765625
    assert np.signbit(quantize(np.array([-1e-30]), FP16))[0]            # −tiny rounds to −0


def test_bad_input_errors(rng):
    with pytest.raises(ValueError, match="exponent bits"):
        FloatFormat(0, 10)
    with pytest.raises(ValueError, match="exponent bits"):
        FloatFormat(12, 10)
    with pytest.raises(ValueError, match="mantissa bits"):
        FloatFormat(5, 0)
    with pytest.raises(TypeError):
        FloatFormat(5.0, 2)
    x = np.ones(3, dtype=np.float32)
    with pytest.raises(ValueError, match="rounding"):
        quantize(x, FP16, rounding="truncate")
    with pytest.raises(ValueError, match="rng"):
        quantize(x, FP16, rounding="stochastic")
    with pytest.raises(TypeError, match="Generator"):
        quantize(x, FP16, rounding="stochastic", rng=np.random.RandomState(0))
    with pytest.raises(TypeError, match="float16/32/64"):
        quantize(np.arange(3), FP16)
    with pytest.raises(TypeError, match="float16/32/64"):
        quantize([1.0, 2.0], FP16)
    with pytest.raises(TypeError, match="FloatFormat"):
        quantize(x, "fp16")
    with pytest.raises(ValueError, match="not all representable"):
        quantize(x.astype(np.float16), BF16)
    with pytest.raises(ValueError, match="not all representable"):
        quantize(x, FloatFormat(11, 10))
    with pytest.raises(TypeError, match="integer"):
        decode(np.array([1.0]), FP16)
    with pytest.raises(ValueError, match="lie in"):
        decode(np.array([256]), FP8_E5M2)
