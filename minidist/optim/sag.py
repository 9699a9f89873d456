"""SAG, the stochastic average gradient (Le Roux, Schmidt & Bach, "Minimizing Finite Sums with the
Stochastic Average Gradient").

For f(w) = (1/n) Σ_i f_i(w), step k draws one index i_k (a sample, or a fixed batch) and
    y_i  = ∇f_i(w_k)   if i = i_k,   else the y_i stored when i was last drawn (0 if never drawn)
    w_{k+1} = w_k − (γ/n) Σ_i y_i
i.e. a step along the average of the *latest gradient of every sample*. Each step computes one
gradient, like SGD, but the stored gradients make the step's noise vanish as w converges, so on a
strongly convex f with a constant γ (the paper uses γ = 1/(16 L)) SAG converges linearly — SGD with a
constant rate stalls at a noise floor. The price is memory: n stored gradients per parameter.

The sum d = Σ_i y_i is kept as state and updated in O(size): d ← d − y_{i_k} + ∇f_{i_k}(w_k).

The tutorial's SAG slide ("Hardware Accelerators for Training Deep Neural Networks") writes
M(t+1) = β M(t) + (1 − β) G(t), W(t+1) = W(t) − λ M(t+1): an exponential moving average of
recent gradients, which is SGD with momentum (dampening τ = β), not SAG: SAG weights the latest
gradient of every sample equally, however long ago it was computed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from minidist.nn.module import Parameter

from .optimizer import Optimizer


class SAG(Optimizer):
    """SAG(params, lr, num_samples): ``step(index)`` with the gradient of f_index in each ``.grad``.

    Args:
        lr: γ >= 0.   num_samples: n >= 1, how many f_i (samples or fixed batches) the loss averages.

    State per parameter: ``gradients`` (n, *shape), the stored y_i, and ``gradient_sum`` (shape), d.
    """

    hyper_parameters = ("num_samples",)
    state_names = ("gradients", "gradient_sum")

    def __init__(self, params: Iterable[Parameter], lr: float, num_samples: int):
        self.num_samples = num_samples
        self.check_hyper_parameters()
        super().__init__(params, lr)

    def check_hyper_parameters(self) -> None:
        if (
            isinstance(self.num_samples, (bool, np.bool_))
            or not isinstance(self.num_samples, (int, np.integer))
            or self.num_samples < 1
        ):
            raise ValueError(f"num_samples must be an int >= 1, got {self.num_samples!r}")
        self.num_samples = int(self.num_samples)

    def _init_state(self, p: Parameter) -> dict[str, np.ndarray]:
        return {"gradients": np.zeros((self.num_samples, *p.shape), dtype=p.data.dtype),
                "gradient_sum": np.zeros_like(p.data)}

    def step(self, index: int | None = None) -> None:
        """One SAG step; index in [0, num_samples) names the f_i whose gradient is in every ``.grad``."""
        if index is None:
            raise TypeError(
                "SAG.step(index) needs the index of the sample (or batch) whose gradient is in .grad"
            )
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"SAG.step: index must be an int, got {index!r}")
        if not 0 <= index < self.num_samples:
            raise ValueError(f"SAG.step: index {index} is out of range [0, {self.num_samples})")
        self._check_grads()
        self.step_count += 1
        scale = self.lr / self.num_samples
        for p, state in zip(self.params, self.state):
            stored, total = state["gradients"][index], state["gradient_sum"]
            total += p.grad - stored  # d ← d − y_i + ∇f_i(w)
            stored[...] = p.grad      # y_i ← ∇f_i(w)
            p.data -= scale * total   # w ← w − (γ/n) d

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As Optimizer.load_state_dict; ``gradients`` has shape (num_samples, *shape)."""
        if state_dict.get("optimizer") != "SAG":
            raise ValueError(f"state_dict is for {state_dict.get('optimizer')!r}, this is a SAG")
        n = int(state_dict["hyper_parameters"]["num_samples"])
        saved = state_dict["state"]
        if len(saved) != len(self.params):
            raise ValueError(
                f"state_dict has state for {len(saved)} parameters, this SAG has {len(self.params)}"
            )
        for i, (p, arrays) in enumerate(zip(self.params, saved)):
            expected = {"gradients": (n, *p.shape), "gradient_sum": p.shape}
            for key, array in arrays.items():
                if key not in expected or np.shape(array) != expected[key]:
                    raise ValueError(
                        f"params[{i}].{key}: expected one of {expected}, got shape {np.shape(array)}"
                    )
        self.num_samples = n
        self.check_hyper_parameters()
        self.lr = state_dict["lr"]
        self.step_count = int(state_dict["step_count"])
        self.state = [{key: np.array(a, dtype=p.data.dtype, copy=True) for key, a in arrays.items()}
                      for p, arrays in zip(self.params, saved)]
