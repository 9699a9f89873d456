"""LARS: layer-wise adaptive rate scaling (You, Gitman & Ginsburg 2017, arXiv:1708.03888).

Large-batch training needs a large learning rate (the linear scaling rule), but one global rate is too
large for some layers and too small for others: the ratio |w| / |∇f(w)| differs by orders of magnitude
between layers. LARS gives every *parameter array* (a "layer": a weight matrix or a bias vector) its own
local rate, proportional to that ratio, so that each step changes a layer by about the same *fraction*
of its norm (the "Hardware Accelerators for Training Deep Neural Networks" slides, "Layer-Wise Adaptive
Learning Rate": ResNet-50 to
B = 32K).

The form used here — the paper's Algorithm 1, written the way torch writes SGD (η = trust_coefficient,
β = weight_decay, μ = momentum, γ = lr; b starts at zero; norms are Euclidean norms over the whole array)::

    r   = η |w_{t-1}| / (|g_t| + β |w_{t-1}|)      # the trust ratio (local learning rate)
          (r = 1 when |w| = 0 or |g| = 0: a freshly zeroed layer or a layer without gradient)
    b_t = μ b_{t-1} + r (g_t + β w_{t-1})           # momentum SGD on the rescaled, decayed gradient
    w_t = w_{t-1} − γ b_t

The paper puts the global rate inside the momentum (v = m v + γ r (g + β w); w −= v), the slide form of
momentum. With a constant γ both give the same trajectory; when γ changes they differ as SGD's two forms
do (see sgd.py). No dampening, no Nesterov; every parameter array is adapted (the paper's setting; later
recipes exclude biases and normalisation parameters — give those to a separate optimizer if you want).

Property (checked in the tests): with μ = 0 and β = 0 the step of a layer has norm γ·η·|w|, independent
of the gradient's scale.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from minidist.nn.module import Parameter

from .optimizer import Optimizer, check_number, in_chunks


def norm(x: np.ndarray) -> float:
    """Euclidean norm of the whole array (float16 is summed in float32: its squares overflow at 65504)."""
    if x.dtype == np.float16:
        x = x.astype(np.float32)
    return float(np.linalg.norm(x.reshape(-1)))


def trust_ratio(w: np.ndarray, g: np.ndarray, trust_coefficient: float, weight_decay: float) -> float:
    """η |w| / (|g| + β |w|), or 1.0 when either norm is zero."""
    w_norm, g_norm = norm(w), norm(g)
    if w_norm == 0.0 or g_norm == 0.0:
        return 1.0
    return trust_coefficient * w_norm / (g_norm + weight_decay * w_norm)


class LARS(Optimizer):
    """LARS(params, lr, momentum=0.9, weight_decay=0, trust_coefficient=0.001).

    Args:
        lr: global rate γ >= 0 (typically large, e.g. from the linear scaling rule, with warm-up).
        momentum: μ in [0, 1).   weight_decay: β >= 0.
        trust_coefficient: η > 0, how far (as a fraction of |w|, times γ) one step may move a layer.

    State per parameter: ``momentum_buffer`` (b) when momentum > 0.
    """

    hyper_parameters = ("momentum", "weight_decay", "trust_coefficient")
    state_names = ("momentum_buffer",)

    def __init__(
        self,
        params: Iterable[Parameter],
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
    ):
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.trust_coefficient = trust_coefficient
        self.check_hyper_parameters()
        super().__init__(params, lr)

    def check_hyper_parameters(self) -> None:
        self.momentum = check_number("momentum", self.momentum, high=1.0, high_open=True)
        self.weight_decay = check_number("weight_decay", self.weight_decay)
        self.trust_coefficient = check_number("trust_coefficient", self.trust_coefficient, low_open=True)

    def _init_state(self, p: Parameter) -> dict[str, np.ndarray]:
        return {"momentum_buffer": np.zeros_like(p.data)} if self.momentum > 0 else {}

    def step(self) -> None:
        """One update; the trust ratio needs the norms of a whole layer before its chunks are updated."""
        self._check_grads()
        self.step_count += 1
        for p, state in zip(self.params, self.state):
            ratio = trust_ratio(p.data, p.grad, self.trust_coefficient, self.weight_decay)
            for w, g, s in in_chunks(p.data, p.grad, state):
                self._update(w, g, s, ratio)

    def _update(self, w: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray], ratio: float = 1.0) -> None:
        if self.weight_decay != 0:
            g = g + self.weight_decay * w
        g = ratio * g  # a new array: p.grad stays the loss gradient
        if self.momentum > 0:
            buf = state["momentum_buffer"]
            buf *= self.momentum
            buf += g  # b_t = μ b + r (g + β w)
            g = buf
        w -= self.lr * g
