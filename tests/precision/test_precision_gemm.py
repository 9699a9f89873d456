"""Low-precision GEMM: equal to a scalar loop that rounds after every addition; chunking helps."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.precision import FP8_E4M3, FP8_E5M2, FP16, FP32, FloatFormat, lowp_dot, lowp_matmul, quantize


def scalar_reference(a, b, operand_fmt, accum_fmt, chunk):
    """One output element at a time, one product at a time — the definition, written plainly."""
    def rnd(v, fmt):
        return float(quantize(np.array(v), fmt))
    m, k_total = a.shape
    c = np.zeros((m, b.shape[1]))
    for i in range(m):
        for j in range(b.shape[1]):
            acc = partial = 0.0
            for k in range(k_total):
                term = rnd(a[i, k], operand_fmt) * rnd(b[k, j], operand_fmt)
                if chunk is None:
                    acc = rnd(acc + term, accum_fmt)
                else:
                    partial = rnd(partial + term, accum_fmt)
                    if (k + 1) % chunk == 0 or k + 1 == k_total:
                        acc, partial = rnd(acc + partial, accum_fmt), 0.0
            c[i, j] = acc
    return c


@given(st.integers(1, 4), st.integers(1, 24), st.integers(1, 4), st.one_of(st.none(), st.integers(1, 30)),
       st.sampled_from([(FP8_E5M2, FP16), (FP8_E4M3, FP16), (FP8_E5M2, FloatFormat(6, 9))]),
       st.integers(0, 2**32 - 1))
def test_matches_scalar_reference(m, k, n, chunk, formats, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)) * 10.0 ** rng.integers(-3, 3)
    b = rng.standard_normal((k, n))
    operand_fmt, accum_fmt = formats
    got = lowp_matmul(a, b, operand_fmt, accum_fmt, chunk=chunk)
    assert np.array_equal(got, scalar_reference(a, b, operand_fmt, accum_fmt, chunk))


def test_exact_when_nothing_needs_rounding(rng):
    a = rng.integers(-4, 5, (5, 40)).astype(np.float32)
    b = rng.integers(-4, 5, (40, 3)).astype(np.float32)
    assert np.array_equal(lowp_matmul(a, b, FP8_E5M2, FP32), (a @ b).astype(np.float64))


def test_swamping_and_chunking():
    """4096 products of 1·1 in FP16: sequential stops at 2048 (2048 + 1 ties back to 2048); chunks of 64
    sum to 64 each and 64 chunks reach 4096 exactly."""
    x = np.ones((1, 4096))
    assert lowp_dot(x, x, FP8_E5M2, FP16, chunk=None)[0] == 2048.0
    assert lowp_dot(x, x, FP8_E5M2, FP16)[0] == 4096.0                # the default: chunks of 64


def test_stochastic_accumulation_is_reproducible_and_unbiased_on_average():   # quantize's fast path
    x = np.ones((400, 4096))
    sums = lowp_dot(x, x, FP8_E5M2, FP16, None, rounding="stochastic", rng=np.random.default_rng(3))
    again = lowp_dot(x, x, FP8_E5M2, FP16, None, rounding="stochastic", rng=np.random.default_rng(3))
    assert np.array_equal(sums, again)
    assert sums.min() > 2048.0                          # no stagnation
    assert abs(sums.mean() - 4096.0) < 4 * sums.std() / np.sqrt(sums.size) + 1e-9


def test_bad_input():
    a = np.ones((2, 3))
    with pytest.raises(ValueError, match="inner dimensions"):
        lowp_matmul(a, np.ones((2, 2)))
    with pytest.raises(ValueError, match="wider accumulator"):
        lowp_matmul(a, a.T, FP16, FP16)
    with pytest.raises(ValueError, match="chunk"):
        lowp_matmul(a, a.T, chunk=0)
    with pytest.raises(ValueError, match="rng"):
        lowp_matmul(a, a.T, rounding="stochastic")
    with pytest.raises(ValueError, match="rounding"):
        lowp_matmul(a, a.T, rounding="up")
    with pytest.raises(TypeError):
        lowp_matmul(np.ones((2, 3), dtype=int), a.T)
