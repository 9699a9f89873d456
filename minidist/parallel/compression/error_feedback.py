"""Error feedback: what compression leaves out is not lost, it is added to the next step's gradient.

1-bit SGD (Seide et al., "1-Bit Stochastic Gradient Descent and its Application to Data-Parallel
Distributed Training of Speech DNNs") and Deep Gradient Compression (Lin et al.) both keep a residual
r on each worker (the "Scaling Deep Learning" slides: "send quantized gradients around, keep residuals"):

    c_t = g_t + r_{t-1}            the gradient corrected by what was not sent before
    s_t = decode(encode(c_t))      what the other workers receive
    r_t = c_t − s_t                the quantisation error, carried forward

Summing over steps, s_1 + ... + s_t + r_t = g_1 + ... + g_t: every bit of gradient is sent eventually, only
late. Without it (``ErrorFeedback(codec, enabled=False)``) the error of every step is simply dropped,
and a sign or top-k compressor biases training.
"""

from __future__ import annotations

import numpy as np

from .topk import check_gradient


class ErrorFeedback:
    """A codec (OneBit, TopK, Dense: ``encode``/``decode``, ``n``, ``dtype``) with a residual per worker.

    ``compress(g)`` returns the message to send; ``residual`` (shape (n,)) holds what is still unsent.
    """

    def __init__(self, codec, enabled: bool = True):
        if not (callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))):
            raise TypeError(f"ErrorFeedback needs a codec with encode() and decode(), got "
                            f"{type(codec).__name__}")
        self.codec, self.enabled = codec, bool(enabled)
        self.n, self.dtype = codec.n, codec.dtype
        self.residual = np.zeros(codec.n, dtype=codec.dtype)

    def compress(self, grad: np.ndarray) -> np.ndarray:
        """grad: flat gradient, shape (n,) -> the uint8 message; updates ``residual``."""
        check_gradient(grad, self.residual.size, self.residual.dtype, "ErrorFeedback.compress")
        if not self.enabled:
            return self.codec.encode(grad)
        # BEGIN SOLUTION error_feedback
        # BEGIN PROMPT
        # Hint: correct the gradient by the residual, encode it, and keep as the new residual what the
        # decoded message misses of the corrected gradient (c − decode(message)).
        # END PROMPT
        corrected = grad + self.residual
        message = self.codec.encode(corrected)
        self.residual = corrected - self.codec.decode(message)
        # END SOLUTION
        return message

    def decode(self, message: np.ndarray) -> np.ndarray:
        """message -> the decoded flat gradient, shape (n,)."""
        return self.codec.decode(message)
