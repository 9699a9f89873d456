"""Error feedback: what compression leaves out is not lost, it is added to the next step's gradient.

1-bit SGD (Seide et al.) and Deep Gradient Compression (Lin et al.; both in codecs.py) keep a residual r
on each worker (the "Scaling Deep Learning" slides: "send quantized gradients around, keep residuals"):

    c_t = g_t + r_{t-1}            the gradient corrected by what was not sent before
    s_t = decode(encode(c_t))      what the other workers receive
    r_t = c_t − s_t                the quantisation error, carried forward

Summing over steps, s_1 + ... + s_t + r_t = g_1 + ... + g_t: every bit of gradient is sent eventually, only
late. Without it (``ErrorFeedback(codec, enabled=False)``) the error of every step is simply dropped,
and a sign or top-k compressor biases training.

Deep Gradient Compression (Lin et al.; the "Hardware Accelerators for Training DNNs" slides: "Deep
Gradient Compression", "Momentum Correction"): plain top-k with error feedback accumulates *gradients*
locally; with momentum SGD the delayed entries then miss their momentum. DGC accumulates the *velocity*
instead, on every worker:

    g ← g · min(1, c / ‖g‖)            local gradient clipping (c = the global threshold · P^(-1/2))
    u ← m·u + g                        momentum correction: the local velocity
    v ← v + u                          accumulate the velocity, not the gradient
    send top-k of v;  v[sent] ← 0;  u[sent] ← 0        (momentum factor masking)

and the receivers apply the sum of what was sent with *plain* SGD (w ← w − lr·Σ sent): the momentum
already lives in u. Warm-up: the density starts high and falls exponentially to its final value,
e.g. 25%, 6.25%, 1.5625%, 0.4%, 0.1% over the first epochs (``warmup_density``).
"""

from __future__ import annotations

import numpy as np

from minidist.nn.checks import check_count

from .codecs import TopK, check_gradient, k_of


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
