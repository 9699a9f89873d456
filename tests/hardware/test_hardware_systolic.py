"""The weight-stationary systolic array: exact result, the closed-form cycle count, utilisation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.hardware import systolic
from minidist.hardware.systolic import cycles, run_tile, systolic_matmul, tile_cycles, utilisation


@given(n=st.integers(1, 9), K=st.integers(1, 9), M=st.integers(1, 9), k=st.integers(1, 5),
       seed=st.integers(0, 2**16))
def test_systolic_matmul_is_exact_and_takes_the_closed_form_cycles(n, K, M, k, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (n, K), dtype=np.int64)          # int8 values, wide accumulator
    w = rng.integers(-128, 128, (K, M), dtype=np.int64)
    c, total, busy = systolic_matmul(a, w, k)
    assert c.dtype == np.int64 and np.array_equal(c, a @ w)
    assert total == cycles(n, K, M, k) == -(-K // k) * -(-M // k) * (n + 2 * (k - 1))
    assert busy == n * K * M                                      # every useful MAC done exactly once
    assert utilisation(n, K, M, k) == busy / (k * k * total)


@given(K=st.integers(1, 12), M=st.integers(1, 12), k=st.integers(1, 6))
def test_tile_schedule_covers_every_weight_once_in_tiles_of_at_most_k(K, M, k):
    count = np.zeros((K, M), int)
    for rows, cols in systolic.tile_schedule(K, M, k):
        assert 0 < rows.stop - rows.start <= k and 0 < cols.stop - cols.start <= k
        count[rows, cols] += 1
    assert (count == 1).all()
    assert len(systolic.tile_schedule(K, M, k)) == -(-K // k) * -(-M // k)


def test_systolic_tile_frames_show_the_skewed_wavefront():
    """Row r of A is at PE (i, j) exactly at cycle r + i + j."""
    n, k = 4, 3
    frames: list = []
    out, total, _ = run_tile(np.arange(n * k, dtype=float).reshape(n, k), np.eye(k), frames=frames)
    assert total == len(frames) == tile_cycles(n, k) == n + 2 * (k - 1)
    for c, frame in enumerate(frames):
        i, j = np.indices((k, k))
        r = c - i - j
        assert np.array_equal(frame, np.where((r >= 0) & (r < n), r, -1))
    assert np.array_equal(out, np.arange(n * k, dtype=float).reshape(n, k))


def test_utilisation_rises_with_the_batch_and_falls_with_ragged_shapes():
    assert utilisation(256, 256, 256, 256) < 0.34                # n = k: fill and drain cost 2(k − 1)
    assert utilisation(65536, 256, 256, 256) > 0.99
    assert utilisation(65536, 257, 256, 256) < 0.51              # one column too many: a second tile


def test_systolic_bad_input_is_refused():
    with pytest.raises(ValueError, match="inner dimensions"):
        systolic_matmul(np.ones((2, 3)), np.ones((4, 2)), 2)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        systolic_matmul(np.ones((2, 3)), np.ones((3, 2)), 0)
    with pytest.raises(TypeError, match="2-D"):
        systolic_matmul(np.ones(3), np.ones((3, 2)), 2)


def test_int8_operands_accumulate_wide_and_non_numbers_are_refused():
    """int8 operands used to be multiplied and summed in int8 (1×4 · 4×1 of 100s gave 64, not 40000)."""
    for dtype in (np.int8, np.uint8, np.int16):
        a, w = np.full((1, 4), 100, dtype), np.full((4, 1), 100, dtype)
        for k in (1, 2, 4):
            c, _, _ = systolic_matmul(a, w, k)
            assert c.tolist() == [[40000]] and c.dtype == np.int64
    a = np.random.default_rng(0).integers(-128, 128, (3, 5)).astype(np.int8)
    w = np.random.default_rng(1).integers(-128, 128, (5, 2)).astype(np.int8)
    assert np.array_equal(systolic_matmul(a, w, 2)[0], a.astype(np.int64) @ w.astype(np.int64))
    for bad in (np.array([["a"]]), np.array([[None]]), np.array([[1j]]), np.array([[True]])):
        with pytest.raises(TypeError, match="systolic_matmul a must be an array of real numbers"):
            systolic_matmul(bad, np.ones((1, 1)), 2)
