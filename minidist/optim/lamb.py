"""LAMB: layer-wise adaptive moments for large batches (You et al. 2019, "Large batch optimization for deep
learning: Training BERT in 76 minutes", arXiv:1904.00962, Algorithm 2), cited by the "Distributed Deep
Learning (Part II)" slides.

LARS (lars.py) rescales SGD's step of every layer to a fixed fraction of the layer's norm; LAMB does the
same to *Adam's* step. Per parameter array (a "layer" x, norms over the whole array, t = 1, 2, ...)::

    m_t = β1 m_{t-1} + (1 − β1) g_t                m̂_t = m_t / (1 − β1^t)      (bias correction)
    v_t = β2 v_{t-1} + (1 − β2) g_t²               v̂_t = v_t / (1 − β2^t)
    u_t = m̂_t / (sqrt(v̂_t) + ε) + λ x_{t-1}        Adam's direction plus decoupled weight decay λ
    x_t = x_{t-1} − η · (φ(|x_{t-1}|) / |u_t|) · u_t    the trust ratio φ(|x|)/|u|, φ(z) = z here

(ratio 1 when |x| = 0 or |u| = 0). So every layer moves by η·|x| per step, whatever the scale of its
gradient: the learning rate η is a *relative* step size, and one η serves layers whose gradients differ
by orders of magnitude. The paper's φ may clip |x| to [γ_l, γ_u]; ``max_trust`` caps the ratio instead
(None: no cap). Cost: Adam's, plus two norms per layer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from minidist.nn.module import Parameter

from .lars import norm
from .optimizer import Optimizer, check_betas, check_number


def lamb_trust_ratio(w: np.ndarray, update: np.ndarray) -> float:
    """φ(|w|) / |update| with φ the identity: the factor that makes the layer's step η·|w| long
    (1.0 when either norm is zero: a freshly zeroed layer, or nothing to do)."""
    # BEGIN SOLUTION lamb_trust_ratio
    # BEGIN PROMPT
    # Hint: the Euclidean norms of the whole arrays (lars.norm); guard the two zero cases.
    # END PROMPT
    w_norm, u_norm = norm(w), norm(update)
    if w_norm == 0.0 or u_norm == 0.0:
        return 1.0
    return w_norm / u_norm
    # END SOLUTION


class LAMB(Optimizer):
    """LAMB(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, max_trust=None).

    Args:
        lr: η >= 0, the step as a fraction of each layer's norm.   betas: (β1, β2), each in [0, 1).
        eps: ε > 0.   weight_decay: λ >= 0 (added to the Adam direction, inside the trust ratio).
        max_trust: optional upper bound on the trust ratio (> 0).

    State per parameter: ``exp_avg`` (m), ``exp_avg_sq`` (v). ``last_trust_ratios`` holds each
    parameter's ratio of the latest step (for plots).
    """

    hyper_parameters = ("betas", "eps", "weight_decay", "max_trust")
    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: Iterable[Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        max_trust: float | None = None,
    ):
        self.betas, self.eps, self.weight_decay, self.max_trust = betas, eps, weight_decay, max_trust
        self.check_hyper_parameters()
        super().__init__(params, lr)
        self.last_trust_ratios: list[float] = []

    def check_hyper_parameters(self) -> None:
        self.betas = check_betas(self.betas)
        self.eps = check_number("eps", self.eps, low_open=True)
        self.weight_decay = check_number("weight_decay", self.weight_decay)
        if self.max_trust is not None:
            self.max_trust = check_number("max_trust", self.max_trust, low_open=True)

    def _init_state(self, p: Parameter) -> dict[str, np.ndarray]:
        return {"exp_avg": np.zeros_like(p.data), "exp_avg_sq": np.zeros_like(p.data)}

    def step(self) -> None:
        """One update of every layer; the trust ratio needs the whole layer's update before applying it."""
        self._check_grads()
        self.step_count += 1
        beta1, beta2 = self.betas
        bias_correction1 = 1 - beta1**self.step_count
        bias_correction2 = 1 - beta2**self.step_count
        self.last_trust_ratios = []
        for p, state in zip(self.params, self.state):
            m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
            m *= beta1
            m += (1 - beta1) * g                                            # m_t
            v *= beta2
            v += (1 - beta2) * (g * g)                                      # v_t
            update = (m / bias_correction1) / (np.sqrt(v) / math.sqrt(bias_correction2) + self.eps)
            if self.weight_decay != 0:
                update += self.weight_decay * p.data                        # u_t = r_t + λ x
            ratio = lamb_trust_ratio(p.data, update)
            if self.max_trust is not None:
                ratio = min(ratio, self.max_trust)
            self.last_trust_ratios.append(ratio)
            p.data -= (self.lr * ratio) * update
