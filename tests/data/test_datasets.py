"""minidist.data: digits, MNIST IDX files, synthetic sets (datasets.py); batching, sharding (sampler.py)."""

import gzip
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.data import blobs, iterate_batches, load_digits, load_mnist, shard, spirals


def test_digits_shapes_split_and_range():
    data = load_digits()
    assert data.x_train.shape == (1437, 64) and data.x_test.shape == (360, 64)
    assert data.y_train.shape == (1437,) and data.y_test.shape == (360,)
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int64
    assert 0.0 <= data.x_train.min() and data.x_train.max() <= 1.0
    assert set(np.unique(data.y_test)) == set(range(10))
    images = load_digits(images=True, dtype=np.float64)
    assert images.x_train.shape == (1437, 1, 8, 8) and images.x_test.dtype == np.float64
    # the split is fixed: a second load gives the same arrays, and train and test share no image
    again = load_digits()
    assert np.array_equal(again.x_train, data.x_train) and np.array_equal(again.y_test, data.y_test)
    train_rows = {row.tobytes() for row in data.x_train}
    assert sum(row.tobytes() in train_rows for row in data.x_test) <= 5  # a few digits are exact duplicates


def write_idx(path, array: np.ndarray, compress: bool = False):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    opener = gzip.open if compress else open
    with opener(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.mark.parametrize("compress", [False, True])
def test_load_mnist_reads_idx_files(tmp_path, compress):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    ext = ".gz" if compress else ""
    for stem, array in [("train-images-idx3-ubyte", images), ("train-labels-idx1-ubyte", labels),
                        ("t10k-images-idx3-ubyte", images[:2]), ("t10k-labels-idx1-ubyte", labels[:2])]:
        write_idx(tmp_path / (stem + ext), array, compress)
    data = load_mnist(str(tmp_path))
    assert data.x_train.shape == (5, 1, 28, 28) and data.x_test.shape == (2, 1, 28, 28)
    np.testing.assert_allclose(data.x_train[:, 0], images / 255.0, rtol=1e-6)
    assert data.y_train.tolist() == [3, 1, 4, 1, 5] and data.y_test.dtype == np.int64


def test_load_mnist_names_the_missing_file(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((1, 2, 2)))
    with pytest.raises(FileNotFoundError, match="train-labels-idx1-ubyte"):
        load_mnist(str(tmp_path))


def test_load_mnist_rejects_a_truncated_file(tmp_path):
    for stem in ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"]:
        write_idx(tmp_path / stem, np.zeros((2, 3)))
    (tmp_path / "train-images-idx3-ubyte").write_bytes(bytes([0, 0, 8, 2, 0, 0, 0, 9, 0, 0, 0, 9, 1, 2]))
    with pytest.raises(ValueError, match="header says"):
        load_mnist(str(tmp_path))


def test_synthetic_sets_are_seeded():
    x, y = spirals(50, 3, np.random.default_rng(1))
    assert x.shape == (150, 2) and np.bincount(y).tolist() == [50, 50, 50]
    assert np.array_equal(x, spirals(50, 3, np.random.default_rng(1))[0])
    xb, yb = blobs(20, 4, 5, np.random.default_rng(2))
    assert xb.shape == (80, 5) and xb.dtype == np.float32 and np.bincount(yb).tolist() == [20] * 4


@given(n=st.integers(0, 50), batch=st.integers(1, 16), drop_last=st.booleans(), seed=st.integers(0, 1000))
def test_iterate_batches_covers_every_index_once(n, batch, drop_last, seed):
    batches = list(iterate_batches(n, batch, np.random.default_rng(seed), drop_last=drop_last))
    assert all(len(b) == batch for b in batches[:-1])
    seen = np.concatenate(batches) if batches else np.array([], dtype=int)
    assert len(set(seen.tolist())) == len(seen)
    assert len(seen) == (n - n % batch if drop_last else n)
    again = list(iterate_batches(n, batch, np.random.default_rng(seed), drop_last=drop_last))
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))


def test_iterate_batches_errors_and_order():
    assert [b.tolist() for b in iterate_batches(5, 2, None, shuffle=False)] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="explicit rng"):
        list(iterate_batches(5, 2, None))
    with pytest.raises(ValueError, match="batch_size"):
        list(iterate_batches(5, 0, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 2.5"):
        list(iterate_batches(5, 2.5, np.random.default_rng(0)))     # used to fail inside range()
    with pytest.raises(ValueError, match="n must be an integer >= 0, got 5.0"):
        list(iterate_batches(5.0, 2, np.random.default_rng(0)))


@given(n=st.integers(0, 40), world_size=st.integers(1, 8))
def test_shard_partitions_the_indices(n, world_size):
    indices = np.arange(n) * 3
    pieces = [shard(indices, r, world_size) for r in range(world_size)]
    assert np.array_equal(np.concatenate(pieces), indices)
    sizes = [len(p) for p in pieces]
    assert max(sizes) - min(sizes) <= 1


def test_shard_errors():
    with pytest.raises(ValueError, match="rank"):
        shard(np.arange(4), 2, 2)
    with pytest.raises(ValueError, match="world_size"):
        shard(np.arange(4), 0, 0)
    with pytest.raises(ValueError, match=r"shard rank must be an integer in \[0, 2\), got 0.5"):
        shard(np.arange(4), 0.5, 2)                                   # used to give a piece
    with pytest.raises(ValueError, match="shard world_size must be an integer >= 1, got True"):
        shard(np.arange(4), 0, True)
