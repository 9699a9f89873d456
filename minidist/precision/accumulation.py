"""The FP8 recipe's GEMMs with a low-precision accumulator: Wang et al. 2018 ("FP8 is used for
representations and FP16 is used for accumulation and updates", chunk size 64).

An attachment of the step runner (minidist/nn/runner.py) that redoes every plain ``Linear`` unit's three
matrix products with ``lowp_matmul`` — operands rounded to ``operand_fmt``, every addition rounded into
``accum_fmt``, in chunks of ``chunk`` products whose sums are added into the total in ``accum_fmt`` too,
as Wang et al. do:

    forward    y  = lowp(x · Wᵀ) + b        K = in_features
    backward   dW = lowp(dyᵀ · x)           K = the batch (rows of x)
               dx = lowp(dy · W)            K = out_features   (skipped where the runner skips dx)

The bias and its gradient db = Σ_n dy[n] stay in float32, as do all other layers (ReLU, the loss). The
layer computes its float32 result first and the attachment replaces it, so a model needs no change.
"""

from __future__ import annotations

import numpy as np

from minidist.nn.linear import Linear
from minidist.nn.runner import Attachment

from .formats import FP8_E5M2, FP16, FloatFormat
from .gemm import _check_options, lowp_matmul


class LowpAccumulation(Attachment):
    """Attach after a MixedPrecisionTrainer (``trainer.runner.attachments.append(...)``, as fp8_trainer
    does): after_* events fire in reverse, so the products are redone before the trainer rounds them."""

    def __init__(self, accum_fmt: FloatFormat = FP16, chunk: int | None = 64,
                 operand_fmt: FloatFormat = FP8_E5M2):
        _check_options(operand_fmt, accum_fmt, chunk, "nearest", None)
        self.accum_fmt, self.chunk, self.operand_fmt = accum_fmt, chunk, operand_fmt
        self._dy, self._grad_before = {}, {}

    def _matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return lowp_matmul(a, b, self.operand_fmt, self.accum_fmt, chunk=self.chunk).astype(np.float32)

    def after_forward(self, i, layer, y):
        if type(layer) is not Linear:
            return y
        out = self._matmul(layer._x2d, layer.weight.data.T)
        if layer.bias is not None:
            out += layer.bias.data
        return out.reshape(y.shape)

    def before_backward(self, i, layer, dy):
        if type(layer) is Linear:            # the gradient added before this pass, and this pass's dy
            self._grad_before[i] = layer.weight.grad.copy()
            self._dy[i] = dy.reshape(-1, layer.out_features)
        return dy

    def after_backward(self, i, layer, dx):
        if type(layer) is not Linear:
            return dx
        dy, before = self._dy.pop(i), self._grad_before.pop(i)
        layer.weight.grad[...] = before + self._matmul(dy.T, layer._x2d)
        if dx is None:
            return None
        return self._matmul(dy, layer.weight.data).reshape(dx.shape)
