"""The codecs: a flat gradient (n,) as a uint8 message and back, 1-bit and top-k, or the dense bytes.

1-bit SGD's quantiser (Seide et al., "1-Bit Stochastic Gradient Descent and its Application to
Data-Parallel Distributed Training of Speech DNNs"; the "Scaling Deep Learning" slides: "send quantized
gradients around, keep residuals"). Each group (a whole tensor, or one column of a weight matrix) is sent as

    bit_i = [x_i >= 0]          mean_+ = mean of the x_i with bit 1,   mean_- = mean of those with bit 0
    decoded_i = mean_+ if bit_i else mean_-

so the decoded group has the same sum as the original. The wire format is one uint8 array: the bits of
all n entries packed 8 to a byte (ceil(n / 8) bytes), then the 2·groups reconstruction values in the
value dtype — 32x fewer bytes than float32, plus the scales. Non-finite input propagates, it is never
masked: a NaN or ±Inf entry makes its group's mean on its side NaN or ±Inf, so every decoded entry of
that side is non-finite and a loss scaler's overflow check (``DynamicLossScaler.unscale``) sees it and
skips the step, as with an uncompressed gradient.

Top-k sparsification (Lin et al., "Deep Gradient Compression: Reducing the Communication Bandwidth for
Distributed Training"; the "Hardware Accelerators for Training DNNs" slides): most of a gradient's
entries are tiny; send the largest k = ceil(ratio · n), keep the rest locally until they have grown
large enough.

    message = [values of the k largest |x_i| (value dtype) | their indices (int32)]   k·(itemsize + 4) bytes

Indices are sorted ascending; ties in |x| are broken by numpy's argpartition, deterministically. With
k = n every entry is sent and the decoded gradient is x itself.
"""

from __future__ import annotations

import math

import numpy as np

from minidist.nn.checks import check_count, is_count

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


class Dense:
    """No compression: the message is the flat gradient's bytes (n · itemsize)."""

    def __init__(self, n: int, dtype=np.float32):
        self.n, self.dtype = check_count(n, "Dense: n"), check_dtype(dtype)
        self.message_bytes = self.n * self.dtype.itemsize

    def encode(self, x: np.ndarray) -> np.ndarray:
        return check_gradient(x, self.n, self.dtype, "Dense.encode").view(np.uint8).copy()

    def decode(self, message: np.ndarray) -> np.ndarray:
        return check_message(message, self.message_bytes, "Dense.decode").view(self.dtype).copy()


class OneBit:
    """Sign + two means per group, for flat gradients made of tensors of the given ``shapes``.

    Args:
        shapes: the tensors' shapes, in the order they are concatenated into the flat gradient.
        per: "tensor" (one group per tensor) or "column" (one group per column of a 2-D tensor, Seide's
            choice; other tensors stay one group).
        dtype: the gradients' float dtype (the reconstruction values travel in it).
    """

    def __init__(self, shapes: list[tuple[int, ...]], per: str = "tensor", dtype=np.float32):
        if per not in ("tensor", "column"):
            raise ValueError(f"OneBit: per must be 'tensor' or 'column', got {per!r}")
        shapes = [tuple(check_count(d, "OneBit: a shape entry", 0) for d in s) for s in shapes]
        if not shapes or any(int(np.prod(s)) == 0 for s in shapes):
            raise ValueError(f"OneBit needs at least one non-empty tensor shape, got {shapes}")
        self.shapes, self.per, self.dtype = shapes, per, check_dtype(dtype)
        self.n = sum(int(np.prod(s)) for s in shapes)
        # group id of every flat entry: a tensor, or (per="column") a column of a 2-D tensor
        ids, first = [], 0
        for shape in shapes:
            if per == "column" and len(shape) == 2:
                ids.append(first + np.tile(np.arange(shape[1]), shape[0]))   # row-major: entry (i, j) -> j
                first += shape[1]
            else:
                ids.append(np.full(int(np.prod(shape)), first))
                first += 1
        self.group, self.groups = np.concatenate(ids), first
        self.order = np.argsort(self.group, kind="stable")           # entries sorted by group, and
        self.starts = np.searchsorted(self.group[self.order], np.arange(first))   # where each group starts
        self.message_bytes = (self.n + 7) // 8 + 2 * self.groups * self.dtype.itemsize

    def encode(self, x: np.ndarray) -> np.ndarray:
        """x: flat gradient, shape (n,) -> the message, uint8 of shape (message_bytes,)."""
        x = check_gradient(x, self.n, self.dtype, "OneBit.encode")
        bits = x >= 0
        xs, bs = x[self.order].astype(np.float64), bits[self.order]      # grouped; sums in float64
        count = np.diff(np.append(self.starts, self.n))
        ones = np.add.reduceat(bs.astype(np.int64), self.starts)
        plus = np.add.reduceat(np.where(bs, xs, 0.0), self.starts)
        minus = np.add.reduceat(np.where(bs, 0.0, xs), self.starts)     # a NaN lands here (NaN >= 0 is False)
        sides = np.stack([ones, count - ones])
        # An empty side's mean is never decoded: 0 there. Nothing else is masked (see the module docstring).
        scales = np.divide(np.stack([plus, minus]), sides, out=np.zeros(sides.shape), where=sides > 0)
        scales = scales.astype(self.dtype)
        return np.concatenate([np.packbits(bits), scales.ravel().view(np.uint8)])

    def decode(self, message: np.ndarray) -> np.ndarray:
        """message: uint8 (message_bytes,) -> the decoded flat gradient, shape (n,), in the value dtype."""
        check_message(message, self.message_bytes, "OneBit.decode")
        packed = (self.n + 7) // 8
        bits = np.unpackbits(message[:packed], count=self.n).astype(bool)
        scales = message[packed:].view(self.dtype).reshape(2, self.groups)
        return np.where(bits, scales[0][self.group], scales[1][self.group])


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
            got = f"{getattr(message, 'dtype', type(message).__name__)} {getattr(message, 'shape', '')}"
            raise ValueError(f"TopK.decode expects a uint8 message of k·{width} bytes with "
                             f"0 < k <= {self.n}, got {got}")
        k = message.size // width
        values = message[:k * self.dtype.itemsize].view(self.dtype)
        index = message[k * self.dtype.itemsize:].view(np.int32)
        if index.min() < 0 or index.max() >= self.n:      # (a negative index would wrap around silently)
            raise ValueError(f"TopK.decode: the message's indices must lie in [0, {self.n}), got "
                             f"{index.min()}..{index.max()}")
        dense = np.zeros(self.n, dtype=self.dtype)
        dense[index] = values
        return dense

