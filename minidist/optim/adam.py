"""Adam (with the AMSGrad variant) and AdamW (decoupled weight decay).

torch.optim.Adam's rule, step for step (γ = lr, β1, β2 = betas, ε = eps, λ = weight_decay, t = 1, 2, ...;
m, v (and v_max) are state arrays of the parameter's shape, starting at zero)::

    g_t   = ∇f(w_{t-1}) + λ w_{t-1}                    # Adam: L2 penalty in the gradient
    m_t   = β1 m_{t-1} + (1 − β1) g_t                  # 1st moment: moving average of gradients
    v_t   = β2 v_{t-1} + (1 − β2) g_t²                 # 2nd moment: moving average of squared gradients
    v_max = max(v_max, v_t)  and use v_max for v_t      # amsgrad only (the max of the *raw* v_t)
    w_t   = w_{t-1} − γ · (m_t / (1 − β1^t)) / (sqrt(v_t / (1 − β2^t)) + ε)

AdamW (Loshchilov & Hutter) instead shrinks the weights directly, outside the adaptive scaling::

    w_{t-1} ← (1 − γλ) w_{t-1}                          # then the Adam step above with λ = 0

The slides ("Hardware Accelerators for Training Deep Neural Networks" slides, "Adam") write the same rule
with bias correction::

    M(t+1) = β1 M(t) + (1 − β1) G(t);   M̂ = M(t+1) / (1 − β1^t)
    V(t+1) = β2 V(t) + (1 − β2) G²(t);  V̂ = V(t+1) / (1 − β2^t)
    W(t+1) = W(t) − λ M̂ / (sqrt(V̂) + ε)

Here the two forms agree step for step, also when the learning rate changes: the learning rate is applied
outside the moving averages in both. (The slide's index t on the bias correction counts steps from 1.)
The slide's exercise — "there is a bug in this algorithm, can you build a counterexample?" — is Reddi et
al.'s: because v_t may *shrink*, the effective step γ/sqrt(v̂) may grow, and Adam can fail to converge on a
simple convex problem; AMSGrad's running max of v_t repairs it (lessons/02_optimizers.py shows both).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from minidist.nn.module import Parameter

from .optimizer import Optimizer, check_betas, check_number


class Adam(Optimizer):
    """Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False) — as torch.

    Args:
        lr: γ >= 0.   betas: (β1, β2), each in [0, 1).   eps: ε > 0, keeps the division finite.
        weight_decay: λ >= 0 (added to the gradient; see AdamW for the decoupled form).
        amsgrad: use the running maximum of v_t (Reddi et al., "On the convergence of Adam and beyond").

    State per parameter: ``exp_avg`` (m), ``exp_avg_sq`` (v) and, with amsgrad, ``max_exp_avg_sq``.
    """

    hyper_parameters = ("betas", "eps", "weight_decay", "amsgrad")
    state_names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    decoupled_weight_decay = False  # AdamW sets True

    def __init__(
        self,
        params: Iterable[Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
    ):
        self.betas = betas
        self.eps = eps
        self.weight_decay = weight_decay
        self.amsgrad = amsgrad
        self.check_hyper_parameters()
        super().__init__(params, lr)

    def check_hyper_parameters(self) -> None:
        self.betas = check_betas(self.betas)
        self.eps = check_number("eps", self.eps, low_open=True)
        self.weight_decay = check_number("weight_decay", self.weight_decay)
        if not isinstance(self.amsgrad, (bool, np.bool_)):
            raise TypeError(f"amsgrad must be True or False, got {self.amsgrad!r}")
        self.amsgrad = bool(self.amsgrad)

    def _init_state(self, p: Parameter) -> dict[str, np.ndarray]:
        state = {"exp_avg": np.zeros_like(p.data), "exp_avg_sq": np.zeros_like(p.data)}
        if self.amsgrad:
            state["max_exp_avg_sq"] = np.zeros_like(p.data)
        return state

    def _update(self, w: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray]) -> None:
        """One Adam step of one parameter, in place: w (any shape), its gradient g, its state.

        m ← β1 m + (1 − β1) g, v ← β2 v + (1 − β2) g² (state["exp_avg"], state["exp_avg_sq"], in place);
        with amsgrad, v below is the running max state["max_exp_avg_sq"] ← max(it, v);
        w ← w − γ · (m / (1 − β1ᵗ)) / (sqrt(v / (1 − β2ᵗ)) + ε), t = self.step_count."""
        if self.weight_decay != 0:
            if self.decoupled_weight_decay:
                w *= 1 - self.lr * self.weight_decay  # AdamW: shrink the weights themselves
            else:
                g = g + self.weight_decay * w  # Adam: L2 penalty in the gradient (p.grad stays as is)
        beta1, beta2 = self.betas
        t = self.step_count
        # BEGIN SOLUTION adam
        # BEGIN PROMPT
        # Hint: update m = state["exp_avg"] and v = state["exp_avg_sq"] in place; with amsgrad keep the
        # running max of v in state["max_exp_avg_sq"] and use it for v; bias-correct with 1 − β^t; w −= ...
        # END PROMPT
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= beta1
        m += (1 - beta1) * g  # m_t = β1 m + (1 − β1) g
        v *= beta2
        g2 = g * g
        g2 *= 1 - beta2
        v += g2  # v_t = β2 v + (1 − β2) g²
        if self.amsgrad:
            np.maximum(state["max_exp_avg_sq"], v, out=state["max_exp_avg_sq"])
            v = state["max_exp_avg_sq"]
        bias_correction1 = 1 - beta1**t
        bias_correction2 = 1 - beta2**t
        step = np.sqrt(v)  # then in place (out=): the step reuses one array
        step /= math.sqrt(bias_correction2)
        step += self.eps  # sqrt(v̂) + ε
        np.divide(m, step, out=step)
        step *= self.lr / bias_correction1
        w -= step  # γ m̂ / (sqrt(v̂) + ε)
        # END SOLUTION


class AdamW(Adam):
    """AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False) — as torch.

    Adam with *decoupled* weight decay: w ← (1 − γλ) w before the Adam step, instead of adding λw to the
    gradient (where Adam's division by sqrt(v̂) would rescale the decay coordinate by coordinate).
    """

    decoupled_weight_decay = True

    def __init__(
        self,
        params: Iterable[Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
    ):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
