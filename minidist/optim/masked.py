"""Keep pruned weights at exactly zero under any optimizer.

Masking the gradient (g ⊙ m) is not enough: momentum buffers, Adam's moments and RMSprop's averages
hold values from before pruning and keep moving a pruned weight, and decoupled weight decay
(AdamW: w ← (1 − γλ) w) leaves 0 at 0 only if it was 0 before. So every step is
    g ← g ⊙ m;   optimizer.step();   w ← w ⊙ m;   every state array s of w: s ← s ⊙ m,
the last so that the optimizer's memory of a pruned weight is gone too (a state kept per sample, as
SAG's, is masked per sample). The masks are read from the model's ``Masked`` layers at every step, so
a gradual schedule may change them between steps.
Source: "Hardware Accelerators for Training Deep Neural Networks" tutorial, chapter "Sparsity".
"""

from __future__ import annotations

from minidist.nn.module import Module
from minidist.nn.pruning import Masked

from .optimizer import Optimizer


class MaskedOptimizer:
    """MaskedOptimizer(optimizer, model): ``step()`` applies the masks of model's Masked layers around
    ``optimizer.step()``. ``zero_grad``, ``lr``, ``state_dict`` are the wrapped optimizer's."""

    def __init__(self, optimizer: Optimizer, model: Module):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"MaskedOptimizer wraps a minidist.optim.Optimizer, got {type(optimizer).__name__}"
            )
        self.optimizer = optimizer
        self.wrappers = [m for m in model.modules() if isinstance(m, Masked)]
        if not self.wrappers:
            raise ValueError(
                "the model has no Masked layers (use minidist.nn.prune or wrap layers in Masked)"
            )
        self._index = {id(p): i for i, p in enumerate(optimizer.params)}
        for wrapper in self.wrappers:
            for p, _ in wrapper.masks():
                if id(p) not in self._index:
                    raise ValueError(f"a masked parameter of {wrapper!r} is not among the optimizer's params")

    def step(self, *args, **kwargs) -> None:
        """g ⊙ m, the wrapped optimizer's step (arguments passed on, e.g. SAG's sample index), w ⊙ m."""
        pairs = [pair for wrapper in self.wrappers for pair in wrapper.masks()]
        for p, mask in pairs:
            p.grad[~mask] = 0
        self.optimizer.step(*args, **kwargs)
        for p, mask in pairs:
            p.data[~mask] = 0
            for _name, array in self.optimizer.state[self._index[id(p)]].items():
                if array.shape == mask.shape:
                    array[~mask] = 0
                elif array.shape[1:] == mask.shape:
                    array[:, ~mask] = 0

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    @property
    def lr(self) -> float:
        return self.optimizer.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.optimizer.lr = value

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"MaskedOptimizer({self.optimizer!r}, {len(self.wrappers)} masked layers)"
