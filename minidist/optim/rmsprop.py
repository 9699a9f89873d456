"""RMSprop (Tieleman & Hinton 2012), with optional momentum and the centered variant.

torch.optim.RMSprop's rule, step for step (γ = lr, α = alpha, ε = eps, λ = weight_decay, μ = momentum;
v, ḡ and b are state arrays of the parameter's shape, starting at zero)::

    g_t = ∇f(w_{t-1}) + λ w_{t-1}
    v_t = α v_{t-1} + (1 − α) g_t²                     # running average of squared gradients
    if centered:                                        # divide by a running *variance* instead
        ḡ_t = α ḡ_{t-1} + (1 − α) g_t
        d_t = sqrt(v_t − ḡ_t²) + ε
    else:
        d_t = sqrt(v_t) + ε
    if μ > 0:  b_t = μ b_{t-1} + g_t / d_t;   w_t = w_{t-1} − γ b_t
    else:      w_t = w_{t-1} − γ g_t / d_t

The slides ("Hardware Accelerators for Training Deep Neural Networks" slides, "Adagrad and RMSProp") write::

    V_i(t) = γ V_i(t − 1) + (1 − γ) G_i²(t)          # their γ is our α; their λ(t) our γ
    ΔW_i(t + 1) = −λ(t) G_i(t) / sqrt(V_i(t) + ε)

Without momentum the two differ only in where ε sits (inside the square root on the slide, outside in
torch: with the defaults a difference only where v is ~1e-8 or smaller). With momentum torch multiplies
the accumulated buffer by the current learning rate, so — as for SGD — a change of lr rescales the past
steps too.
v_t − ḡ_t² is clipped at 0 (rounding can make it slightly negative; torch does not clip).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from minidist.nn.module import Parameter

from .optimizer import Optimizer, check_number


class RMSprop(Optimizer):
    """RMSprop(params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False).

    Args:
        lr: γ >= 0.   alpha: α in [0, 1), the smoothing constant.   eps: ε > 0.
        weight_decay: λ >= 0.   momentum: μ in [0, 1).   centered: normalise by the running variance.

    State per parameter: ``square_avg`` (v), and ``grad_avg`` (ḡ) if centered, ``momentum_buffer`` (b)
    if momentum > 0.
    """

    hyper_parameters = ("alpha", "eps", "weight_decay", "momentum", "centered")
    state_names = ("square_avg", "grad_avg", "momentum_buffer")

    def __init__(self, params: Iterable[Parameter], lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False):
        self.alpha = alpha
        self.eps = eps
        self.weight_decay = weight_decay
        self.momentum = momentum
        self.centered = centered
        self.check_hyper_parameters()
        super().__init__(params, lr)

    def check_hyper_parameters(self) -> None:
        self.alpha = check_number("alpha", self.alpha, high=1.0, high_open=True)
        self.eps = check_number("eps", self.eps, low_open=True)
        self.weight_decay = check_number("weight_decay", self.weight_decay)
        self.momentum = check_number("momentum", self.momentum, high=1.0, high_open=True)
        if not isinstance(self.centered, (bool, np.bool_)):
            raise TypeError(f"centered must be True or False, got {self.centered!r}")
        self.centered = bool(self.centered)

    def _init_state(self, p: Parameter) -> dict[str, np.ndarray]:
        state = {"square_avg": np.zeros_like(p.data)}
        if self.centered:
            state["grad_avg"] = np.zeros_like(p.data)
        if self.momentum > 0:
            state["momentum_buffer"] = np.zeros_like(p.data)
        return state

    def _update(self, w: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray]) -> None:
        alpha = self.alpha
        if self.weight_decay != 0:
            g = g + self.weight_decay * w
        v = state["square_avg"]
        v *= alpha
        v += (1 - alpha) * (g * g)  # v_t = α v + (1 − α) g²
        if self.centered:
            grad_avg = state["grad_avg"]
            grad_avg *= alpha
            grad_avg += (1 - alpha) * g  # ḡ_t = α ḡ + (1 − α) g
            denom = v - grad_avg * grad_avg
            np.maximum(denom, 0, out=denom)  # a variance: clip rounding noise below 0
            np.sqrt(denom, out=denom)
        else:
            denom = np.sqrt(v)
        denom += self.eps
        if self.momentum > 0:
            buf = state["momentum_buffer"]
            buf *= self.momentum
            buf += g / denom  # b_t = μ b + g / d
            w -= self.lr * buf
        else:
            w -= self.lr * (g / denom)
