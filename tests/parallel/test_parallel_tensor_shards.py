"""Shard arithmetic and the communication-volume formulas of tensor parallelism (no processes needed)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.parallel.tensor.comm import feature_bounds, feature_slice
from minidist.parallel.tensor.cost import (
    column_parallel_words,
    data_parallel_words,
    hybrid_words,
    megatron_words,
    memory_words_per_device,
    seed_t_comm_data,
    seed_t_comm_model,
)


@given(n=st.integers(1, 200), parts=st.integers(1, 16))
def test_parallel_tensor_shard_bounds_match_array_split(n, parts):
    if parts > n:
        with pytest.raises(ValueError, match=f"cannot split {n} features into {parts} shards"):
            feature_bounds(n, parts)
        return
    bounds = feature_bounds(n, parts)
    expected = [(int(a[0]), int(a[-1]) + 1) for a in np.array_split(np.arange(n), parts)]
    assert bounds == expected
    sizes = [hi - lo for lo, hi in bounds]
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert [feature_slice(n, parts, p) for p in range(parts)] == [slice(lo, hi) for lo, hi in bounds]


def test_parallel_tensor_shard_bad_arguments():
    with pytest.raises(ValueError, match="at least one shard"):
        feature_bounds(5, 0)
    with pytest.raises(ValueError, match="shard index 3 outside"):
        feature_slice(5, 3, 3)


@given(d=st.integers(1, 64), layers=st.integers(1, 5), batch=st.integers(1, 64), parts=st.integers(1, 8))
def test_parallel_tensor_column_words_are_the_seed_formula(d, layers, batch, parts):
    widths = [d] * (layers + 1)
    # Summed over ranks the code moves P × (one rank's seed T_comm) words, for square layers.
    assert column_parallel_words(widths, batch, parts) == pytest.approx(parts * seed_t_comm_model(
        widths, batch, parts), rel=1e-12)
    # Data parallelism's ring all-reduce moves twice the seed's T_comm(data) (no biases here).
    assert data_parallel_words(layers * d * d, parts) == pytest.approx(2 * parts * seed_t_comm_data(
        widths, parts), rel=1e-12)


def test_parallel_tensor_words_by_hand():
    # Two layers 4 → 6 → 3, B = 5, P = 3.
    # column scheme: all-gather 2·5·6 + 2·5·3 = 90; all-reduce of layer 2's input grad 2·2·5·6 = 120.
    assert column_parallel_words([4, 6, 3], 5, 3) == 210
    assert column_parallel_words([4, 6, 3], 5, 3, input_grad=True) == 210 + 2 * 2 * 5 * 4
    # Megatron: one all-reduce forward of (5, 3): 2·2·15 = 60; the first block's input grad is skipped.
    assert megatron_words([4, 6, 3], 5, 3) == 60
    assert megatron_words([4, 6, 3, 7, 2], 5, 3) == 60 + 2 * 2 * 5 * 2 + 2 * 2 * 5 * 3
    with pytest.raises(ValueError, match="even number of layers"):
        megatron_words([4, 6, 3, 7], 5, 3)
    assert data_parallel_words(100, 4) == 600
    # Hybrid 2 × 2: model words at the full batch + each of the 2 columns all-reduces its shard over D = 2.
    assert hybrid_words(60, [10, 12], 2) == 60 + 2 * 10 + 2 * 12
    assert seed_t_comm_model([8, 8, 8], 4, 2) == pytest.approx(16 + 16 + 2 * 16)
    assert seed_t_comm_data([8, 8, 8], 2, beta=0.5) == pytest.approx(0.5 * 2 * 32)


def test_parallel_tensor_memory_per_device():
    mem = memory_words_per_device(
        [10, 20, 10], batch=8, data=2, tensor=2, optimizer_states=1
    )
    assert mem["weights"] == (200 + 200) / 2
    assert mem["gradients"] == mem["weights"] == mem["optimizer"]
    assert mem["activations"] == 8 / 2 * 40
    assert mem["total"] == 3 * 200 + 160
    with pytest.raises(ValueError, match="widths must be"):
        memory_words_per_device([10], 8, 1, 1)
