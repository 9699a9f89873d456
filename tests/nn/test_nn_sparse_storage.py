"""Sparse storage formats: exact round trips, byte counts equal to the formulas, sparsity measurement."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential
from minidist.nn.sparse_storage import COO, CSR, BlockCSR, dense_nbytes
from minidist.nn.sparsity import forward_with_activation_sparsity, sparsity, weight_sparsity


def sparse_matrix(rows, cols, density, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((rows, cols)).astype(dtype)
    a[rng.random((rows, cols)) >= density] = 0
    return a


matrices = st.builds(sparse_matrix, st.integers(1, 12), st.integers(1, 12), st.floats(0.0, 1.0),
                     st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64, np.float16]))


@given(a=matrices, index_dtype=st.sampled_from([np.int16, np.int32, np.int64]))
def test_coo_and_csr_round_trip_and_bytes(a, index_dtype):
    v, i = a.itemsize, np.dtype(index_dtype).itemsize
    nnz, rows = np.count_nonzero(a), a.shape[0]
    coo, csr = COO.from_dense(a, index_dtype), CSR.from_dense(a, index_dtype)
    for fmt in (coo, csr):
        back = fmt.to_dense()
        assert back.dtype == a.dtype and back.tobytes() == a.tobytes()
    assert coo.nbytes == nnz * (v + 2 * i)
    assert csr.nbytes == nnz * (v + i) + (rows + 1) * i


@given(a=matrices, bh=st.integers(1, 3), bw=st.integers(1, 3))
def test_block_csr_round_trip_and_bytes(a, bh, bw):
    a = np.tile(a, (bh, bw))  # a shape the block divides
    blocks = BlockCSR.from_dense(a, (bh, bw))
    assert blocks.to_dense().tobytes() == a.tobytes()
    grid = a.reshape(a.shape[0] // bh, bh, a.shape[1] // bw, bw).transpose(0, 2, 1, 3)
    nb = int(grid.reshape(*grid.shape[:2], -1).any(axis=2).sum())
    assert blocks.nbytes == nb * bh * bw * a.itemsize + nb * 4 + (a.shape[0] // bh + 1) * 4


def test_conv_weight_round_trips_in_its_shape():
    w = sparse_matrix(6, 27, 0.3, 1).reshape(6, 3, 3, 3)
    for fmt in (COO.from_dense(w), CSR.from_dense(w), BlockCSR.from_dense(w, (1, 9))):
        assert np.array_equal(fmt.to_dense(), w) and fmt.to_dense().shape == w.shape


def test_indices_eat_fine_grained_savings_and_blocks_do_not():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 576)).astype(np.float32)
    dense = dense_nbytes(w)
    # 40 % of single weights
    fine = w.copy()
    fine[rng.random(w.shape) < 0.4] = 0
    # 26/64 ≈ 40 % of filters
    coarse = w.copy()
    coarse[rng.permutation(64)[:26]] = 0
    assert CSR.from_dense(fine).nbytes > 0.95 * dense                        # the indices ate the savings
    assert BlockCSR.from_dense(coarse, (1, 576)).nbytes < 0.62 * dense      # ≈ 60 % left, one index a row
    assert COO.from_dense(fine).nbytes > dense


def test_sparsity_measurement():
    rng = np.random.default_rng(1)
    model = Sequential(
        Conv2d(1, 3, 3, padding=1, rng=rng),
        ReLU(),
        MaxPool2d(2),
        Flatten(),
        Linear(48, 5, rng=rng),
        ReLU(),
        Linear(5, 2, rng=rng),
    )
    model[0].weight.data[0] = 0
    x = rng.standard_normal((4, 1, 8, 8)).astype(np.float32)
    y, measured = forward_with_activation_sparsity(model, x)
    assert np.array_equal(y, model(x)) and sorted(measured) == [1, 5]
    h = model[0](x)
    assert measured[1] == np.mean(np.maximum(h, 0) == 0)
    ws = weight_sparsity(model)
    assert ws["layers.0.weight"] == 1 / 3 and 0 < ws["total"] < 1
    assert sparsity(np.array([0.0, -0.0, 1.0, 2.0])) == 0.5


def test_errors():
    with pytest.raises(ValueError, match="divide"):
        BlockCSR.from_dense(np.ones((4, 6), dtype=np.float32), (3, 2))
    with pytest.raises(ValueError, match="does not fit"):
        CSR.from_dense(np.ones((2, 200), dtype=np.float32), index_dtype=np.int8)
    with pytest.raises(TypeError, match="integer"):
        COO.from_dense(np.ones((2, 2)), index_dtype=np.float32)
    with pytest.raises(ValueError, match="float"):
        CSR.from_dense(np.ones((2, 2), dtype=int))
    with pytest.raises(ValueError, match="empty"):
        sparsity(np.zeros(0))


def test_a_1d_array_such_as_a_bias_round_trips_as_one_row():
    bias = np.array([0.0, 1.5, 0.0, -2.0, 3.0], dtype=np.float32)
    for fmt in (COO.from_dense(bias), CSR.from_dense(bias), BlockCSR.from_dense(bias, (1, 5))):
        assert np.array_equal(fmt.to_dense(), bias) and fmt.to_dense().shape == (5,)
    coo = COO.from_dense(bias)
    assert coo.rows.tolist() == [0, 0, 0] and coo.cols.tolist() == [1, 3, 4]
