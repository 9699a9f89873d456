"""Top-k sparsification: send only the k entries of largest magnitude, as values and indices.

Lin et al., "Deep Gradient Compression: Reducing the Communication Bandwidth for Distributed
Training" (the "Hardware Accelerators for Training DNNs" slides, "Deep Gradient Compression"): most of a
gradient's entries are tiny; send the largest k = ceil(ratio · n), keep the rest locally (error
feedback) until they have grown large enough.

    message = [values of the k largest |x_i| (value dtype) | their indices (int32)]   k·(itemsize + 4) bytes

Indices are sorted ascending; ties in |x| are broken by numpy's argpartition, deterministically. With
k = n every entry is sent and the decoded gradient is x itself.
"""

from __future__ import annotations

import math

import numpy as np

from minidist.checks import check_count, is_count

FLOATS = (np.float32, np.float64)


def check_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.type not in FLOATS:
        raise TypeError(f"compression works on float32 or float64 gradients, got {dtype}")
    return dtype


def check_gradient(x, n: int, dtype: np.dtype, where: str) -> np.ndarray:
    """x itself if it is a flat gradient of shape (n,) and ``dtype``; else a ValueError naming ``where``
    (the codecs' and compressors' check before they touch any state)."""
    if not (isinstance(x, np.ndarray) and x.shape == (n,) and x.dtype == dtype):
        raise ValueError(f"{where} expects a flat {dtype} gradient of shape ({n},), got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}")
    return x


def check_message(message, nbytes: int, where: str) -> np.ndarray:
    """message itself if it is a uint8 array of shape (nbytes,); else a ValueError naming ``where``."""
    if not (isinstance(message, np.ndarray) and message.dtype == np.uint8 and message.shape == (nbytes,)):
        got = f"{getattr(message, 'dtype', type(message).__name__)} {getattr(message, 'shape', '')}"
        raise ValueError(f"{where} expects a uint8 message of {nbytes} bytes, got {got}")
    return message


def k_of(n: int, ratio: float) -> int:
    """ceil(ratio · n), at least 1: how many entries a density ``ratio`` in (0, 1] keeps of n."""
    if not 0 < ratio <= 1:
        raise ValueError(f"the density ratio must be in (0, 1], got {ratio}")
    return max(1, min(n, math.ceil(ratio * n - 1e-9)))


class TopK:
    """Keep the k entries of largest magnitude of a flat gradient of n entries.

    Args:
        n: length of the flat gradient.
        k: entries sent per message, 0 < k <= n (or give ``ratio``: k = ceil(ratio · n)).
        dtype: the gradient's float dtype.
    """

    def __init__(self, n: int, k: int | None = None, ratio: float | None = None, dtype=np.float32):
        n = check_count(n, "TopK: n")
        if (k is None) == (ratio is None):
            raise ValueError("TopK: give exactly one of k and ratio")
        k = k_of(n, ratio) if k is None else k
        if not is_count(k) or k > n:
            raise ValueError(f"TopK: k must be an integer with 0 < k <= n = {n}, got {k!r}")
        if n >= 2**31:
            raise ValueError(f"TopK: int32 indices address at most 2**31 - 1 entries, got n = {n}")
        self.n, self.k, self.dtype = int(n), int(k), check_dtype(dtype)
        self.message_bytes = self.k * (self.dtype.itemsize + 4)

    def select(self, x: np.ndarray, k: int | None = None) -> np.ndarray:
        """The sorted int32 indices of the k entries of largest |x| (k defaults to self.k)."""
        k = self.k if k is None else k
        if not 0 < k <= self.n:
            raise ValueError(f"TopK: k must satisfy 0 < k <= n = {self.n}, got {k}")
        if k == self.n:
            return np.arange(self.n, dtype=np.int32)
        return np.sort(np.argpartition(np.abs(x), self.n - k)[self.n - k:]).astype(np.int32)

    def encode(self, x: np.ndarray, k: int | None = None) -> np.ndarray:
        """x: flat gradient (n,) -> the message, uint8 of shape (k · (itemsize + 4),)."""
        check_gradient(x, self.n, self.dtype, "TopK.encode")
        index = self.select(x, k)
        return np.concatenate([x[index].view(np.uint8), index.view(np.uint8)])

    def decode(self, message: np.ndarray) -> np.ndarray:
        """message: uint8 (k · (itemsize + 4),) -> the dense gradient (n,): the k values, zeros elsewhere."""
        width = self.dtype.itemsize + 4
        if not (isinstance(message, np.ndarray) and message.dtype == np.uint8 and message.ndim == 1
                and message.size % width == 0 and 0 < message.size // width <= self.n):
            raise ValueError(
                f"TopK.decode expects a uint8 message of k·{width} bytes with 0 < k <= {self.n}, got "
                f"{getattr(message, 'dtype', type(message).__name__)} {getattr(message, 'shape', '')}"
            )
        k = message.size // width
        values = message[:k * self.dtype.itemsize].view(self.dtype)
        index = message[k * self.dtype.itemsize:].view(np.int32)
        if index.min() < 0 or index.max() >= self.n:      # (a negative index would wrap around silently)
            raise ValueError(f"TopK.decode: the message's indices must lie in [0, {self.n}), got "
                             f"{index.min()}..{index.max()}")
        dense = np.zeros(self.n, dtype=self.dtype)
        dense[index] = values
        return dense
