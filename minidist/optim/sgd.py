"""Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay.

torch.optim.SGD's rule, step for step (γ = lr, μ = momentum, τ = dampening, λ = weight_decay; t counts
steps from 1; ``b`` is the momentum buffer, one array per parameter)::

    g_t = ∇f(w_{t-1}) + λ w_{t-1}               # weight decay = L2 penalty λ/2·|w|², added to the gradient
    if μ != 0:
        b_t = g_t                     if t == 1
        b_t = μ b_{t-1} + (1 − τ) g_t otherwise
        g_t = g_t + μ b_t             if nesterov   ("look-ahead": the gradient plus the next momentum)
        g_t = b_t                     otherwise
    w_t = w_{t-1} − γ g_t

The slides ("Classical GD with momentum", Polyak 1964; the "Hardware Accelerators for Training Deep
Neural Networks" slides) write::

    M(t+1) = β M(t) − λ(t) G(t)                 # λ is the *learning rate* there, β the momentum
    W(t+1) = W(t) + M(t+1)

The two agree when τ = 0 and the learning rate is constant: then M = −γ b at every step. When the rate
changes, torch multiplies the *whole* buffer by the new rate (w −= γ_new · b), while the slide's M keeps
past gradients at the rates they were taken with (torch's choice: pytorch/pytorch#1099). Unrolled,
b_t = Σ_k μ^{t−k} g_k: momentum is an exponentially weighted average of gradients over ≈ 1/(1−μ) steps
("SGD with momentum as gradients averaging"). Nesterov (Sutskever et al.) evaluates the gradient at
w + μ M; torch uses the equivalent step along g_t + μ b_t, which needs the gradient at w only.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from minidist.nn.module import Parameter

from .optimizer import Optimizer, check_number, in_chunks


class SGD(Optimizer):
    """SGD(params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False) — as torch.optim.SGD.

    Args:
        params: the Parameters to update (``model.parameters()``).
        lr: learning rate γ >= 0.
        momentum: μ in [0, 1); 0 is plain gradient descent.
        dampening: τ in [0, 1]; scales the newest gradient by (1 − τ) in the buffer (not on step 1).
        weight_decay: λ >= 0, L2 penalty added to the gradient.
        nesterov: Nesterov momentum; needs momentum > 0 and dampening == 0 (as in torch).

    State per parameter: ``momentum_buffer`` (created at the first step when momentum != 0).
    """

    hyper_parameters = ("momentum", "dampening", "weight_decay", "nesterov")
    state_names = ("momentum_buffer",)

    def __init__(self, params: Iterable[Parameter], lr: float, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False):
        self.momentum = momentum
        self.dampening = dampening
        self.weight_decay = weight_decay
        self.nesterov = nesterov
        self.check_hyper_parameters()
        super().__init__(params, lr)

    def check_hyper_parameters(self) -> None:
        self.momentum = check_number("momentum", self.momentum, high=1.0, high_open=True)
        self.dampening = check_number("dampening", self.dampening, high=1.0)
        self.weight_decay = check_number("weight_decay", self.weight_decay)
        if not isinstance(self.nesterov, (bool, np.bool_)):
            raise TypeError(f"nesterov must be True or False, got {self.nesterov!r}")
        self.nesterov = bool(self.nesterov)
        if self.nesterov and (self.momentum == 0 or self.dampening != 0):
            raise ValueError(f"nesterov=True needs momentum in (0, 1) and dampening == 0, got "
                             f"momentum={self.momentum}, dampening={self.dampening}")

    def step(self) -> None:
        """One update of every parameter from its ``.grad`` (the gradients themselves are not changed)."""
        self._check_grads()
        self.step_count += 1
        for p, state in zip(self.params, self.state):
            # torch creates the buffer at the first step that uses momentum, and sets b_1 = g_1 there
            first = self.momentum != 0 and "momentum_buffer" not in state
            if first:
                state["momentum_buffer"] = np.empty_like(p.data)
            for w, g, s in in_chunks(p.data, p.grad, state):
                self._update(w, g, s, first)

    def _update(
        self, w: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray], first: bool = False
    ) -> None:
        """w −= γ·(direction), in place; ``first`` says the momentum buffer is new (b_1 = g_1)."""
        momentum, dampening = self.momentum, self.dampening
        if self.weight_decay != 0:
            g = g + self.weight_decay * w  # a new array: p.grad stays the loss gradient
        if momentum != 0:
            # BEGIN SOLUTION sgd_momentum
            # BEGIN PROMPT
            # Hint: b = state["momentum_buffer"] (update it in place). On the first step b = g; after that
            # b = μ b + (1 − τ) g. Then step along g + μ b (Nesterov) or along b: set g to that direction.
            # END PROMPT
            buf = state["momentum_buffer"]
            if first:  # b_1 = g_1 (no dampening)
                buf[...] = g
            else:  # b_t = μ b_{t-1} + (1 − τ) g_t, in place
                buf *= momentum
                buf += g if dampening == 0 else (1 - dampening) * g
            g = g + momentum * buf if self.nesterov else buf
            # END SOLUTION
        w -= self.lr * g
