"""Losses: ``loss = L.forward(prediction, target)`` (mean over the batch), ``dpred = L.backward()``.

CrossEntropyLoss, logits z (N, C), integer labels t (N,) in [0, C) — or, as torch.nn.CrossEntropyLoss
accepts for sequences, z (B, T, C) with t (B, T), averaged over all N = B·T positions:
    log p = z − logsumexp(z)                   (stable: subtract max z before exp, so ±1000 stays finite)
    loss  = −(1/N) Σ_n log p[n, t_n]
    dz    = (softmax(z) − onehot(t)) / N

MSELoss, prediction y and target of one shape:
    loss  = mean((y − target)²)
    dy    = 2 (y − target) / y.size
"""

from __future__ import annotations

import numpy as np

from .module import check_float_array
from .softmax import log_softmax


class CrossEntropyLoss:
    """Softmax + negative log-likelihood, averaged over the batch (torch.nn.CrossEntropyLoss)."""

    def __init__(self):
        self._probs: np.ndarray | None = None
        self._target: np.ndarray | None = None

    def forward(self, logits: np.ndarray, target: np.ndarray) -> float:
        """logits: shape (N, C) or (B, T, C); target: integer labels, shape (N,) or (B, T); returns the
        mean loss over all N (or B·T) positions (a float)."""
        check_float_array(logits, "CrossEntropyLoss logits", ndim=(2, 3))
        target = np.asarray(target)
        if not np.issubdtype(target.dtype, np.integer):
            raise TypeError(f"CrossEntropyLoss target: expected integer class labels, got dtype {target.dtype}")
        if target.shape != logits.shape[:-1]:
            raise ValueError(f"CrossEntropyLoss target: expected shape {logits.shape[:-1]} (logits' shape "
                             f"without C), got {target.shape}")
        logits_shape = logits.shape
        logits, target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)  # (B, T, C) -> (N, C)
        n, c = logits.shape
        if n and (target.min() < 0 or target.max() >= c):
            raise ValueError(f"CrossEntropyLoss target: labels must lie in [0, {c}), "
                             f"got range [{target.min()}, {target.max()}]")
        if n == 0:
            raise ValueError("CrossEntropyLoss: empty batch")
        log_probs = log_softmax(logits, axis=1)  # z − max − log Σ e^(z − max): no overflow, no log 0
        self._probs = np.exp(log_probs)
        self._target, self._logits_shape = target, logits_shape
        return float(-log_probs[np.arange(n), target].mean())

    def backward(self) -> np.ndarray:
        """Returns dlogits = (softmax(z) − onehot(t)) / N, shape of the logits, (N, C) or (B, T, C)
        (the loss is the end: no dy)."""
        if self._probs is None:
            raise RuntimeError("CrossEntropyLoss.backward called before forward")
        # BEGIN SOLUTION cross_entropy_backward
        n = self._probs.shape[0]
        dlogits = self._probs.copy()
        dlogits[np.arange(n), self._target] -= 1
        dlogits /= n
        # END SOLUTION
        return dlogits.reshape(self._logits_shape)  # (N, C) back to (B, T, C) when the logits had it

    __call__ = forward


class MSELoss:
    """Mean squared error over every element (torch.nn.MSELoss, reduction='mean')."""

    def __init__(self):
        self._diff: np.ndarray | None = None

    def forward(self, prediction: np.ndarray, target: np.ndarray) -> float:
        """prediction, target: one shape, any; returns mean((prediction − target)²) (a float)."""
        check_float_array(prediction, "MSELoss prediction")
        target = np.asarray(target)
        if target.shape != prediction.shape:
            raise ValueError(f"MSELoss: prediction {prediction.shape} and target {target.shape} differ in shape")
        if prediction.size == 0:
            raise ValueError("MSELoss: empty input")
        self._diff = prediction - target.astype(prediction.dtype, copy=False)
        return float(np.mean(self._diff ** 2))

    def backward(self) -> np.ndarray:
        """Returns dprediction = 2 (prediction − target) / size, shape of prediction."""
        if self._diff is None:
            raise RuntimeError("MSELoss.backward called before forward")
        return 2.0 * self._diff / self._diff.size

    __call__ = forward
