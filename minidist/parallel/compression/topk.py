"""Top-k sparsification and Deep Gradient Compression: send only the k entries of largest magnitude.

Lin et al., "Deep Gradient Compression: Reducing the Communication Bandwidth for Distributed
Training" (the "Hardware Accelerators for Training DNNs" slides: "Deep Gradient Compression", "Momentum
Correction"): most of a gradient's entries are tiny; send the largest k = ceil(ratio · n), keep the rest
locally (error feedback) until they have grown large enough.

    message = [values of the k largest |x_i| (value dtype) | their indices (int32)]   k·(itemsize + 4) bytes

Indices are sorted ascending; ties in |x| are broken by numpy's argpartition, deterministically. With
k = n every entry is sent and the decoded gradient is x itself.

Plain top-k with error feedback accumulates *gradients* locally; with momentum SGD the delayed entries
then miss their momentum. DGC accumulates the *velocity* instead, on every worker:

    g ← g · min(1, c / ‖g‖)            local gradient clipping (c = the global threshold · P^(-1/2))
    u ← m·u + g                        momentum correction: the local velocity
    v ← v + u                          accumulate the velocity, not the gradient
    send top-k of v;  v[sent] ← 0;  u[sent] ← 0        (momentum factor masking)

and the receivers apply the sum of what was sent with *plain* SGD (w ← w − lr·Σ sent): the momentum
already lives in u. Warm-up: the density starts high and falls exponentially to its final value,
e.g. 25%, 6.25%, 1.5625%, 0.4%, 0.1% over the first epochs (``warmup_density``).
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


def warmup_density(step: int, warmup_steps: int, final: float, start: float = 0.25) -> float:
    """The density (fraction sent) at ``step``: start · (final / start)^(step / warmup_steps), then final."""
    if not 0 < final <= start <= 1:
        raise ValueError(f"warmup_density needs 0 < final <= start <= 1, got final={final}, start={start}")
    if warmup_steps < 0 or step < 0:
        raise ValueError(f"warmup_density needs step >= 0 and warmup_steps >= 0, got {step}, {warmup_steps}")
    if step >= warmup_steps:
        return final
    return start * (final / start) ** (step / warmup_steps)


class DGC:
    """Deep Gradient Compression of a flat gradient of n entries on one of ``world_size`` workers.

    Args:
        n: gradient length; dtype: its float dtype.
        density: the final fraction of entries sent (0 < density <= 1).
        momentum: m of the momentum correction (0 <= m < 1; 0 makes it top-k with error feedback).
        clip_norm: the global gradient-norm threshold (None: no clipping); each worker clips at
            clip_norm / sqrt(world_size).
        warmup_steps: steps over which the density falls from ``start_density`` to ``density``.
    """

    def __init__(self, n: int, density: float, *, momentum: float = 0.9, clip_norm: float | None = None,
                 world_size: int = 1, warmup_steps: int = 0, start_density: float = 0.25, dtype=np.float32):
        if not 0 <= momentum < 1:
            raise ValueError(f"DGC: momentum must be in [0, 1), got {momentum}")
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"DGC: clip_norm must be > 0 or None, got {clip_norm}")
        check_count(world_size, "DGC: world_size")
        warmup_density(0, warmup_steps, density, max(density, start_density))   # checks the schedule
        self.codec = TopK(n, ratio=density, dtype=dtype)
        self.n, self.dtype, self.density, self.momentum = self.codec.n, self.codec.dtype, density, momentum
        self.start_density, self.warmup_steps = max(density, start_density), warmup_steps
        self.clip = None if clip_norm is None else clip_norm / np.sqrt(world_size)
        self.u = np.zeros(self.n, dtype=self.dtype)      # local velocity
        self.v = np.zeros(self.n, dtype=self.dtype)      # accumulated velocity (the residual)
        self.steps = 0

    def compress(self, grad: np.ndarray) -> np.ndarray:
        """grad: flat gradient (n,) -> the uint8 top-k message of v; updates u and v."""
        check_gradient(grad, self.n, self.dtype, "DGC.compress")
        if self.clip is not None:
            norm = float(np.linalg.norm(grad))
            if norm > self.clip:
                grad = grad * (self.clip / norm)
        self.u = self.momentum * self.u + grad
        self.v = self.v + self.u
        k = k_of(self.n, warmup_density(self.steps, self.warmup_steps, self.density, self.start_density))
        message = self.codec.encode(self.v, k)
        sent = self.codec.select(self.v, k)
        self.v[sent] = 0
        self.u[sent] = 0
        self.steps += 1
        return message

    def decode(self, message: np.ndarray) -> np.ndarray:
        return self.codec.decode(message)
