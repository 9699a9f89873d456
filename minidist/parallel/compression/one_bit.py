"""1-bit SGD's quantiser: one sign bit per gradient entry plus two reconstruction values per group.

Seide et al., "1-Bit Stochastic Gradient Descent and its Application to Data-Parallel Distributed
Training of Speech DNNs" (the "Scaling Deep Learning" slides: "send quantized gradients around, keep
residuals"). Each group (a whole tensor, or one column of a weight matrix) is sent as

    bit_i = [x_i >= 0]          mean_+ = mean of the x_i with bit 1,   mean_- = mean of those with bit 0
    decoded_i = mean_+ if bit_i else mean_-

so the decoded group has the same sum as the original. The wire format is one uint8 array: the bits of
all n entries packed 8 to a byte (ceil(n / 8) bytes), then the 2·groups reconstruction values in the
value dtype — 32x fewer bytes than float32, plus the scales. What is lost (x − decoded) is what error
feedback (error_feedback.py) carries to the next step.

Non-finite input propagates, it is never masked: a NaN or ±Inf entry makes its group's mean on its side
NaN or ±Inf, so every decoded entry of that side is non-finite and a loss scaler's overflow check
(``DynamicLossScaler.unscale``) sees it and skips the step, as with an uncompressed gradient.
"""

from __future__ import annotations

import numpy as np

from minidist.checks import check_count

from .topk import check_dtype, check_gradient, check_message


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
