"""Element-wise activations. Each keeps what its derivative needs and nothing more.

ReLU:     y = max(x, 0)            dx = dy · [x > 0]
"""

from __future__ import annotations

import numpy as np

from .module import Module, check_float_array


class ReLU(Module):
    def forward(self, x: np.ndarray) -> np.ndarray:
        check_float_array(x, "ReLU input")
        self._mask = x > 0  # a boolean per element: 1 byte, not a copy of x
        return np.where(self._mask, x, 0).astype(x.dtype, copy=False)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        return np.where(self._mask, dy, 0).astype(dy.dtype, copy=False)

    def __repr__(self) -> str:
        return "ReLU()"
