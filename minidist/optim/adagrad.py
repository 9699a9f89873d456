"""Adagrad (Duchi, Hazan & Singer 2011): a per-coordinate step size from the sum of squared gradients.

torch.optim.Adagrad's rule, step for step (γ = lr, η = lr_decay, ε = eps, λ = weight_decay, t = 1, 2, ...;
the sum s starts at ``initial_accumulator_value`` in every coordinate)::

    g_t = ∇f(w_{t-1}) + λ w_{t-1}
    γ_t = γ / (1 + (t − 1) η)                           # optional decay of the global rate
    s_t = s_{t-1} + g_t²
    w_t = w_{t-1} − γ_t g_t / (sqrt(s_t) + ε)

The slides ("Hardware Accelerators for Training Deep Neural Networks" slides, "Adagrad and RMSProp") write::

    V_i(t) = V_i(t − 1) + G_i²(t)
    ΔW_i(t + 1) = −λ G_i(t) / sqrt(V_i(t) + ε)           # their λ is the learning rate

The same rule, except that ε sits inside the square root on the slide and outside in torch (a difference
only while the sum is ~ε or smaller), and the slide has no lr_decay. Because s only grows, each
coordinate's step shrinks like 1/sqrt(t) — "Adagrad decreases step sizes too aggressively", which is what
RMSprop's moving average fixes. The learning rate is outside the sum, so an lr change acts at once in both
forms.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from minidist.nn.module import Parameter

from .optimizer import Optimizer, check_number


class Adagrad(Optimizer):
    """Adagrad(params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10).

    Args:
        lr: γ >= 0.   lr_decay: η >= 0.   weight_decay: λ >= 0.
        initial_accumulator_value: the starting value of the sum of squares, >= 0.   eps: ε > 0.

    State per parameter: ``sum`` (s, the accumulated squared gradients).
    """

    hyper_parameters = ("lr_decay", "weight_decay", "initial_accumulator_value", "eps")
    state_names = ("sum",)

    def __init__(self, params: Iterable[Parameter], lr: float = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0, eps: float = 1e-10):
        self.lr_decay = lr_decay
        self.weight_decay = weight_decay
        self.initial_accumulator_value = initial_accumulator_value
        self.eps = eps
        self.check_hyper_parameters()
        super().__init__(params, lr)

    def check_hyper_parameters(self) -> None:
        self.lr_decay = check_number("lr_decay", self.lr_decay)
        self.weight_decay = check_number("weight_decay", self.weight_decay)
        self.initial_accumulator_value = check_number("initial_accumulator_value",
                                                      self.initial_accumulator_value)
        self.eps = check_number("eps", self.eps, low_open=True)

    def _init_state(self, p: Parameter) -> dict[str, np.ndarray]:
        return {"sum": np.full_like(p.data, self.initial_accumulator_value)}

    def _update(self, w: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray]) -> None:
        if self.weight_decay != 0:
            g = g + self.weight_decay * w
        clr = self.lr / (1 + (self.step_count - 1) * self.lr_decay)  # γ_t
        total = state["sum"]
        total += g * g  # s_t = s + g²
        w -= clr * (g / (np.sqrt(total) + self.eps))
