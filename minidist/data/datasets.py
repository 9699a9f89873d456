"""Datasets: the real handwritten digits, MNIST from IDX files, small synthetic sets.

* ``load_digits()`` — scikit-learn's bundled 8×8 digits (1,797 real images, no download), pixel values
  scaled to [0, 1], split once and for all into 1,437 training and 360 test images (a fixed permutation).
* ``load_mnist(directory)`` — the standard IDX files, when a user has them.
* ``spirals``, ``blobs`` — tiny 2-D classification sets for tests and figures.

Text is the other dataset (text.py); which examples each rank reads, and in which batches, is sampler.py's.
"""

from __future__ import annotations

import gzip
import os
from typing import NamedTuple

import numpy as np

DIGITS_TEST_SIZE = 360
DIGITS_SPLIT_SEED = 1797


class Dataset(NamedTuple):
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_digits(images: bool = False, dtype=np.float32) -> Dataset:
    """The 8×8 digits: x of shape (N, 64), or (N, 1, 8, 8) with ``images=True``; labels int64 in [0, 10)."""
    from sklearn.datasets import load_digits as sklearn_digits  # bundled with scikit-learn

    bunch = sklearn_digits()
    x = (bunch.data / 16.0).astype(dtype)
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(y))
    x, y = x[order], y[order]
    if images:
        x = x.reshape(-1, 1, 8, 8)
    n_train = len(y) - DIGITS_TEST_SIZE
    return Dataset(x[:n_train], y[:n_train], x[n_train:], y[n_train:])


def _read_idx(path: str) -> np.ndarray:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes (magic 0x0000 08 nd)")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims} ({int(np.prod(dims))} bytes), file holds {data.size}")
    return data.reshape(dims)


def load_mnist(directory: str, dtype=np.float32) -> Dataset:
    """MNIST from the four standard IDX files (optionally .gz) in ``directory``.

    Images come back as (N, 1, 28, 28) in [0, 1], labels as int64.
    """
    stems = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    arrays = []
    for stem in stems:
        candidates = [os.path.join(directory, stem + ext) for ext in ("", ".gz")]
        found = [c for c in candidates if os.path.exists(c)]
        if not found:
            raise FileNotFoundError(f"load_mnist: missing {stem} (or {stem}.gz) in {directory!r}")
        arrays.append(_read_idx(found[0]))
    x_train, y_train, x_test, y_test = arrays
    to_images = lambda a: (a.astype(dtype) / 255.0).reshape(-1, 1, *a.shape[1:])
    return Dataset(to_images(x_train), y_train.astype(np.int64), to_images(x_test), y_test.astype(np.int64))


def spirals(n_per_class: int, classes: int, rng: np.random.Generator, noise: float = 0.2,
            dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Interleaved 2-D spirals: x (n_per_class·classes, 2), y int64 labels."""
    xs, ys = [], []
    for c in range(classes):
        r = np.linspace(0.0, 1.0, n_per_class)
        theta = np.linspace(c * 4.0, (c + 1) * 4.0, n_per_class) + rng.standard_normal(n_per_class) * noise
        xs.append(np.stack([r * np.sin(theta), r * np.cos(theta)], axis=1))
        ys.append(np.full(n_per_class, c, dtype=np.int64))
    return np.concatenate(xs).astype(dtype), np.concatenate(ys)


def blobs(n_per_class: int, classes: int, features: int, rng: np.random.Generator, spread: float = 0.5,
          dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters around random centres: x (n_per_class·classes, features), y int64 labels."""
    centres = rng.standard_normal((classes, features)) * 2.0
    x = np.concatenate([c + spread * rng.standard_normal((n_per_class, features)) for c in centres])
    y = np.repeat(np.arange(classes, dtype=np.int64), n_per_class)
    return x.astype(dtype), y
