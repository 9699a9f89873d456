"""Learning-rate schedules: small objects that map a step number to a learning rate.

A schedule is a function of the step — ``lr = schedule(step)`` with step = 0, 1, 2, ... the number of
optimizer steps taken so far — and keeps no state of its own, so it can be composed, plotted, and resumed
from any step. A training loop calls it once per step, before ``optimizer.step()``::

    schedule = LinearWarmup(Cosine(0.1, total_steps=1000), warmup_steps=100)
    for step in range(1000):
        optimizer.lr = schedule(step)
        ...forward, backward...
        optimizer.step()

The schedules: ``Constant``, ``StepDecay`` (×γ every step_size steps), ``Cosine`` (half a cosine from lr to
min_lr), ``LinearWarmup`` (multiplies any schedule by a factor that rises linearly to 1) and
``LinearScalingRule`` (Goyal et al. 2017, "Accurate, large minibatch SGD": lr = base_lr · batch /
base_batch, reached by gradual warm-up from base_lr; the
"Distributed Deep Learning (Part II)" slides, "Solution: Linear Scaling Rule"). Combine the scaling rule with
a decay by composing the pieces, e.g.
Goyal et al.'s recipe (warm-up, then ×0.1 steps)::

    peak = scaled_lr(0.1, batch_size=8192, base_batch_size=256)                  # 3.2
    schedule = LinearWarmup(StepDecay(peak, step_size=3000), warmup_steps=500, start_factor=256 / 8192)

Every schedule returns its end points exactly: Cosine(lr, T)(0) == lr and (T) == min_lr,
LinearWarmup(s, W)(W) == s(W), StepDecay(lr, n)(0) == lr.
"""

from __future__ import annotations

import math

from .optimizer import check_number


def check_count(name: str, value: int, low: int) -> int:
    """An integer >= low (numbers of steps, batch sizes), else TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an integer >= {low}, got {value!r}")
    if int(value) < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


class Schedule:
    """Base class: ``schedule(step) -> lr`` for step = 0, 1, 2, ...; subclasses define ``lr_at``."""

    def __call__(self, step: int) -> float:
        return self.lr_at(check_count("step", step, 0))

    def lr_at(self, step: int) -> float:
        raise TypeError(f"{type(self).__name__} does not define lr_at(step)")


class Constant(Schedule):
    """lr(step) = lr."""

    def __init__(self, lr: float):
        self.lr = check_number("lr", lr)

    def lr_at(self, step: int) -> float:
        return self.lr


class StepDecay(Schedule):
    """lr(step) = lr · gamma^⌊step / step_size⌋: multiply by gamma every step_size steps."""

    def __init__(self, lr: float, step_size: int, gamma: float = 0.1):
        self.lr = check_number("lr", lr)
        self.step_size = check_count("step_size", step_size, 1)
        self.gamma = check_number("gamma", gamma, high=1.0, low_open=True)

    def lr_at(self, step: int) -> float:
        return self.lr * self.gamma ** (step // self.step_size)


class Cosine(Schedule):
    """Half a cosine from lr (step 0) down to min_lr (step total_steps), then min_lr.

    lr(step) = min_lr + (lr − min_lr) · (1 + cos(π · step / T)) / 2  for 0 <= step <= T  (Loshchilov &
    Hutter's SGDR without restarts).
    """

    def __init__(self, lr: float, total_steps: int, min_lr: float = 0.0):
        self.lr = check_number("lr", lr)
        self.total_steps = check_count("total_steps", total_steps, 1)
        self.min_lr = check_number("min_lr", min_lr, high=self.lr)

    def lr_at(self, step: int) -> float:
        if step == 0:
            return self.lr  # exactly: min_lr + (lr − min_lr) may round away from lr
        if step >= self.total_steps:
            return self.min_lr
        weight = (1 + math.cos(math.pi * step / self.total_steps)) / 2
        return self.min_lr + (self.lr - self.min_lr) * weight


class LinearWarmup(Schedule):
    """Multiply another schedule by a factor rising linearly from start_factor (step 0) to 1 (step W).

    lr(step) = schedule(step) · (start_factor + (1 − start_factor) · step / W)  for step < W,
    lr(step) = schedule(step)                                                 for step >= W.
    Large learning rates destabilise the first steps of training; a warm-up ramps into them.
    """

    def __init__(self, schedule: Schedule, warmup_steps: int, start_factor: float = 0.0):
        if not isinstance(schedule, Schedule):
            raise TypeError(
                f"LinearWarmup wraps a Schedule (e.g. Constant(0.1)), got {type(schedule).__name__}"
            )
        self.schedule = schedule
        self.warmup_steps = check_count("warmup_steps", warmup_steps, 0)
        self.start_factor = check_number("start_factor", start_factor, high=1.0)

    def lr_at(self, step: int) -> float:
        if step >= self.warmup_steps:
            return self.schedule.lr_at(step)
        factor = self.start_factor + (1 - self.start_factor) * step / self.warmup_steps
        return self.schedule.lr_at(step) * factor


def scaled_lr(base_lr: float, batch_size: int, base_batch_size: int) -> float:
    """The linear scaling rule: a batch k times larger gets a learning rate k times larger.

    lr = base_lr · batch_size / base_batch_size (e.g. 0.1 for 256 images -> 3.2 for 8192).
    """
    base_lr = check_number("base_lr", base_lr)
    batch_size = check_count("batch_size", batch_size, 1)
    base_batch_size = check_count("base_batch_size", base_batch_size, 1)
    return base_lr * batch_size / base_batch_size


class LinearScalingRule(LinearWarmup):
    """Goyal et al.'s gradual warm-up to the linearly scaled rate, then constant.

    The rate starts at base_lr (what the small batch used) and rises by the same amount every step, to
    scaled_lr(base_lr, batch_size, base_batch_size) at step warmup_steps (0: no warm-up). A batch smaller
    than base_batch_size gets its smaller rate at once. For a decay after the warm-up, compose
    LinearWarmup with StepDecay or Cosine (see the module docstring).
    """

    def __init__(self, base_lr: float, batch_size: int, base_batch_size: int, warmup_steps: int = 0):
        peak = scaled_lr(base_lr, batch_size, base_batch_size)
        self.base_lr, self.batch_size = float(base_lr), int(batch_size)
        self.base_batch_size = int(base_batch_size)
        super().__init__(Constant(peak), warmup_steps, start_factor=min(1.0, base_batch_size / batch_size))

    @property
    def peak_lr(self) -> float:
        return self.schedule.lr_at(0)
