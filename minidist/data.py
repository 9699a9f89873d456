"""Data: the real handwritten digits, MNIST from IDX files, small synthetic sets, batching, sharding.

* ``load_digits()`` — scikit-learn's bundled 8×8 digits (1,797 real images, no download), pixel values
  scaled to [0, 1], split once and for all into 1,437 training and 360 test images (a fixed permutation).
* ``load_mnist(directory)`` — the standard IDX files, when a user has them.
* ``spirals``, ``blobs`` — tiny 2-D classification sets for tests and figures.
* ``iterate_batches`` — mini-batches in an order drawn from an explicit rng.
* ``shard`` — the slice of a batch that rank r of P works on (data parallelism).
* ``load_text()`` — CPython's bundled help() text as a character-level corpus (minidist.text).

The input pipeline lives beside this file and is re-exported here: ``DistributedSampler`` and
``batched`` (sampler.py), ``Loader`` with k worker processes (loader.py); Parquet columns in columnar.py.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from minidist.split import split_range
from minidist.text import TextCorpus, load_text  # noqa: F401  (re-exported: minidist.data.load_text())

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


def iterate_batches(n: int, batch_size: int, rng: np.random.Generator | None, shuffle: bool = True,
                    drop_last: bool = False) -> Iterator[np.ndarray]:
    """Index arrays of mini-batches over range(n), shuffled by ``rng`` (one epoch).

    Use as ``for idx in iterate_batches(len(x), 64, rng): xb, yb = x[idx], y[idx]``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if shuffle and rng is None:
        raise ValueError("iterate_batches(shuffle=True) needs an explicit rng")
    order = rng.permutation(n) if shuffle else np.arange(n)
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        yield order[start:start + batch_size]


def shard(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous piece of ``indices`` (shape (n, ...)): minidist.split's rule, as
    np.array_split cuts it into world_size pieces.

    Pieces differ in length by at most one; when world_size > len(indices) some pieces are empty.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"shard needs 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    lo, hi = split_range(len(indices), world_size, rank)
    return np.asarray(indices)[lo:hi]


from minidist.loader import Loader, LoaderError  # noqa: E402, F401 - the input pipeline, re-exported
from minidist.sampler import DistributedSampler, batched  # noqa: E402, F401
