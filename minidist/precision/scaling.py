"""Loss scaling: keep small gradients representable in FP16/FP8 by scaling the loss (and so, by the chain
rule, every gradient) by s, and dividing the weight gradients by s before the update.

The "Hardware Accelerators for Training Deep Neural Networks" slides ("Loss Scaling" and "Automatic
Loss Scaling", NVIDIA) give the algorithm:

    scale the loss by s;  backprop;  if dW holds Inf/NaN: reduce s, skip the update;
    if no Inf/NaN for N updates: increase s;  scale dW by 1/s;  update W

``DynamicLossScaler`` follows torch.amp.GradScaler exactly (its defaults and its update rule):

    found_inf:  s ← s · backoff_factor,   clean-step counter ← 0          (and the step is skipped)
    otherwise:  counter ← counter + 1;  if counter = growth_interval:  s ← s · growth_factor, counter ← 0

plus an optional floor ``min_scale`` (s never drops below it). The FP8 paper's "enhanced" loss scaling
(Mellempudi et al. 2019, on the same slides) raises that floor on a schedule so that the scale cannot
collapse early in training; set ``scaler.min_scale`` as training proceeds.

Usage, one step:
    loss_grad *= scaler.scale;  backward;  found_inf = scaler.unscale(grads)
    (data parallel: allreduce the grads and found_inf here)
    if not found_inf: optimizer.step();   scaler.update(found_inf)
"""

from __future__ import annotations

import math

import numpy as np

from .formats import check_flag


def _check_positive(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{what} must be a finite positive number, got {value}")
    return float(value)


def unscale_(grads: list[np.ndarray], scale: float) -> bool:
    """grads: float arrays (any shapes), divided by scale in place; returns True if any entry is Inf or
    NaN. The whole list is checked first, so a bad entry leaves every gradient as it was."""
    if isinstance(grads, np.ndarray) or not isinstance(grads, (list, tuple)):
        raise TypeError(f"unscale expects a list of gradient arrays, got {type(grads).__name__}")
    for i, g in enumerate(grads):
        if not isinstance(g, np.ndarray) or not np.issubdtype(g.dtype, np.floating):
            raise TypeError(
                f"unscale expects float numpy arrays, grads[{i}] is "
                f"{type(g).__name__}{' of dtype ' + str(g.dtype) if isinstance(g, np.ndarray) else ''}"
            )
        if not g.flags.writeable:
            raise ValueError(f"unscale divides in place, but grads[{i}] is read-only")
    found_inf = False
    for g in grads:
        g /= scale
        found_inf = found_inf or not bool(np.isfinite(g).all())
    return found_inf


class StaticLossScaler:
    """A fixed scale s. Steps whose gradients overflow are still skipped (the trainer checks found_inf)."""

    def __init__(self, scale: float):
        self.scale = _check_positive(scale, "StaticLossScaler scale")

    def unscale(self, grads: list[np.ndarray]) -> bool:
        """grads /= s in place; returns found_inf."""
        return unscale_(grads, self.scale)

    def update(self, found_inf: bool) -> None:
        """found_inf: True or False. A static scale never changes."""
        check_flag(found_inf, "found_inf")

    def __repr__(self) -> str:
        return f"StaticLossScaler(scale={self.scale:g})"


class DynamicLossScaler:
    """torch.amp.GradScaler's dynamic scale: back off on Inf/NaN, grow after growth_interval clean steps."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, min_scale: float | None = None):
        self.scale = _check_positive(init_scale, "init_scale")
        self.growth_factor = _check_positive(growth_factor, "growth_factor")
        self.backoff_factor = _check_positive(backoff_factor, "backoff_factor")
        if self.growth_factor <= 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor}")
        if self.backoff_factor >= 1.0:
            raise ValueError(f"backoff_factor must be < 1, got {backoff_factor}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, (int, np.integer)) \
                or growth_interval < 1:
            raise ValueError(f"growth_interval must be an int >= 1, got {growth_interval!r}")
        self.growth_interval = int(growth_interval)
        self.min_scale = None if min_scale is None else _check_positive(min_scale, "min_scale")
        self.clean_steps = 0  # torch calls it the growth tracker
        if self.min_scale is not None:
            self.scale = max(self.scale, self.min_scale)

    def unscale(self, grads: list[np.ndarray]) -> bool:
        """grads /= s in place; returns found_inf (some gradient entry is Inf or NaN)."""
        return unscale_(grads, self.scale)

    def update(self, found_inf: bool) -> None:
        """found_inf: True or False (this step's gradients held Inf/NaN). Back off on overflow, grow after
        growth_interval clean steps, respect min_scale."""
        check_flag(found_inf, "found_inf")
        # BEGIN SOLUTION dynamic_loss_scaling
        if found_inf:
            self.scale *= self.backoff_factor
            self.clean_steps = 0
        else:
            self.clean_steps += 1
            if self.clean_steps == self.growth_interval:
                grown = self.scale * self.growth_factor
                if math.isfinite(grown):  # as GradScaler: never grow into Inf
                    self.scale = grown
                self.clean_steps = 0
        if self.min_scale is not None:
            self.scale = max(self.scale, self.min_scale)
        # END SOLUTION

    def __repr__(self) -> str:
        return (f"DynamicLossScaler(scale={self.scale:g}, growth_interval={self.growth_interval}, "
                f"min_scale={self.min_scale})")
