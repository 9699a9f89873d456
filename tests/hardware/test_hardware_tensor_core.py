"""The tensor-core tile: FP16 operands, FP32 accumulation bitwise as float32 hardware would add; FP16
accumulation's error asserted against FP32's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.hardware.tensor_core import mma, tensor_core_matmul
from minidist.precision import FP16


def _float32_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Σ_k in order of k, each addition a float32 addition of an exact FP16·FP16 product."""
    a16, b16 = a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        acc = acc + np.outer(a16[:, k], b16[k])        # the float32 product is exact (22 bits)
    return acc


def test_one_mma_is_a_4x4x4_multiply_accumulate_in_fp32():
    rng = np.random.default_rng(0)
    a, b, c = rng.standard_normal((3, 4, 4))
    d = mma(a, b, c)
    ref = c.astype(np.float32)
    for k in range(4):
        a16, b16 = a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)
        ref = ref + np.outer(a16[:, k], b16[k])                   # exact product, one float32 rounding
    assert np.array_equal(d, ref)


@given(m=st.integers(1, 9), k=st.integers(1, 13), n=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_tensor_core_matmul_equals_sequential_float32_accumulation(m, k, n, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    assert np.array_equal(tensor_core_matmul(a, b), _float32_reference(a, b))


def test_fp16_accumulation_loses_far_more_than_fp32():
    """K = 1024 positive products: the FP16 accumulator's ulp grows with the sum (swamping)."""
    rng = np.random.default_rng(1)
    a, b = rng.uniform(0, 1, (8, 1024)), rng.uniform(0, 1, (1024, 8))
    exact = a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)
    err32 = np.abs(tensor_core_matmul(a, b) - exact).max() / exact.max()
    d16 = tensor_core_matmul(a, b, accum=FP16)
    err16 = np.abs(d16 - exact).max() / exact.max()
    assert np.array_equal(d16, d16.astype(np.float16))            # values of the FP16 format
    assert err32 < 1e-6 and err16 > 1e-3 and err16 > 1000 * err32


def test_tensor_core_bad_input_is_refused():
    with pytest.raises(ValueError, match="4 × 4 tiles"):
        mma(np.ones((4, 3)), np.ones((4, 4)), np.ones((4, 4)))
    with pytest.raises(ValueError, match="inner dimensions"):
        tensor_core_matmul(np.ones((2, 3)), np.ones((4, 2)))


def test_non_real_operands_are_refused():
    """An object array of None used to give NaN, and complex input lost its imaginary part."""
    for bad in (np.array([[None]]), np.array([[1 + 1j]]), np.array([["1"]])):
        with pytest.raises(TypeError, match="tensor_core_matmul a must be an array of real numbers"):
            tensor_core_matmul(bad, np.ones((1, 1)))
        with pytest.raises(TypeError, match="tensor_core_matmul b must be an array of real numbers"):
            tensor_core_matmul(np.ones((1, 1)), bad)
    with pytest.raises(TypeError, match="mma c must be an array of real numbers"):
        mma(np.ones((4, 4)), np.ones((4, 4)), np.full((4, 4), 1j))
