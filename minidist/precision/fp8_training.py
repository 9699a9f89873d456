"""The FP8 training recipe of Mellempudi et al. 2019, "Mixed Precision Training With 8-bit Floating Point"
(the "Hardware Accelerators for Training Deep Neural Networks" tutorial, "Mixed Precision Training with
8-bit Floating Point", "Enhanced and Dynamic Loss Scaling"):

    weights, activations, errors, weight gradients     FP8 (1,5,2) = FP8_E5M2 in every GEMM
    master copy of the weights                          FP16 ("32-bit ⇒ 16-bit")
    weight update                                        w16 ← round_stochastic(w16 − lr·dW)
    loss scaling                                         dynamic, with a minimum that rises during training

One step, with the slides' "apply gradient clipping ... on gradients after 1/s scaling":

    dW·s  = backward of s·L in FP8                     (MixedPrecisionTrainer.forward_backward)
    dW    = dW·s / s;  found_inf?                      (unscale: exact, s a power of two)
    |dW| > max_norm:  dW ← dW · max_norm / |dW|        (clip_grad_norm_, on the unscaled gradients)
    skip if found_inf, else update and round the masters stochastically to FP16

The paper's loss-scale results on ResNet-50: s = 1,000 failed to converge, 4,000 lost 2.3% accuracy,
10,000 converged fully — hence "enhanced" loss scaling: the dynamic scale gets a floor that rises on a
schedule (``EnhancedLossScaler``), so early overflows cannot push it down to where gradients vanish.
Inside the GEMMs (Wang et al. 2018, whom the slides follow: "FP16 is used for accumulation") the products
are summed in FP16 in chunks of 64 (``accumulation.LowpAccumulation``); ``accum_fmt=None`` sums in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from minidist.nn.module import Module

from .accumulation import LowpAccumulation
from .formats import FP8_E5M2, FP16, FloatFormat
from .mixed import MixedPrecisionTrainer
from .scaling import DynamicLossScaler, _check_positive
from .storage import HalfStoredActivations


class EnhancedLossScaler(DynamicLossScaler):
    """A DynamicLossScaler whose floor rises on a schedule.

    floors: [(step, min_scale), ...] with increasing steps and floors; from update number ``step`` on,
    the scale never drops below ``min_scale``. Everything else is DynamicLossScaler's rule."""

    def __init__(self, floors: list[tuple[int, float]], init_scale: float = 2.0**16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5, growth_interval: int = 2000):
        if not isinstance(floors, (list, tuple)) or not floors:
            raise ValueError(f"floors must be a non-empty list of (step, min_scale), got {floors!r}")
        checked = []
        for item in floors:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise ValueError(f"floors must hold (step, min_scale) pairs, got {item!r}")
            step, floor = item
            if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
                raise ValueError(f"a floor's step must be an int >= 0, got {step!r}")
            checked.append((int(step), _check_positive(floor, "a floor's min_scale")))
        if any(b[0] <= a[0] or b[1] < a[1] for a, b in zip(checked, checked[1:])):
            raise ValueError(f"floors must have increasing steps and non-decreasing scales, got {floors!r}")
        self.floors, self.updates = checked, 0
        super().__init__(init_scale, growth_factor, backoff_factor, growth_interval,
                         min_scale=checked[0][1] if checked[0][0] == 0 else None)

    def floor_at(self, update: int) -> float | None:
        """The floor in force after ``update`` updates (None before the first scheduled step)."""
        active = [floor for step, floor in self.floors if step <= update]
        return active[-1] if active else None

    def update(self, found_inf: bool) -> None:
        """DynamicLossScaler.update under the floor in force at this update."""
        self.updates += 1
        self.min_scale = self.floor_at(self.updates)
        super().update(found_inf)


def clip_grad_norm_(grads: list[np.ndarray] | np.ndarray, max_norm: float) -> float:
    """Scale the gradient arrays in place so that their joint Euclidean norm is at most max_norm, as
    torch.nn.utils.clip_grad_norm_ does: g ← g · max_norm / (|g| + 1e-6) when that factor is < 1.
    grads: a list of floating-point arrays, or one array (one gradient, as torch takes one tensor).
    Returns |g| before clipping (Inf/NaN if a gradient holds one; then nothing is changed)."""
    max_norm = _check_positive(max_norm, "max_norm")
    grads = _check_gradients(grads)
    total = math.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads))
    factor = max_norm / (total + 1e-6)
    if math.isfinite(total) and factor < 1.0:
        for g in grads:
            g *= g.dtype.type(factor)
    return total


def _check_gradients(grads) -> list[np.ndarray]:
    """grads as a list of floating-point ndarrays (clipped in place: a list or an integer array could not
    be), or TypeError naming the first that is not one."""
    if isinstance(grads, np.ndarray):
        grads = [grads]
    if not isinstance(grads, (list, tuple)):
        raise TypeError(f"grads must be an ndarray or a list of ndarrays, got {type(grads).__name__}")
    for i, g in enumerate(grads):
        if not isinstance(g, np.ndarray) or g.dtype.kind != "f":
            got = f"dtype {g.dtype}" if isinstance(g, np.ndarray) else type(g).__name__
            raise TypeError(f"grads[{i}] must be a floating-point ndarray (scaled in place), got {got}")
    return list(grads)


def fp8_trainer(model: Module, optimizer, loss_fn, rng: np.random.Generator, *, scaler=None,
                fmt: FloatFormat = FP8_E5M2, master_fmt: FloatFormat = FP16,
                accum_fmt: FloatFormat | None = FP16, chunk: int | None = 64,
                half_storage: bool = True) -> MixedPrecisionTrainer:
    """The recipe as a MixedPrecisionTrainer: W, A, E, G in ``fmt``, masters rounded stochastically to
    ``master_fmt`` after each update, ``scaler`` (default: an EnhancedLossScaler with floor 2^10); the
    Linear layers' GEMMs add their products in ``accum_fmt`` in chunks of ``chunk`` (None: sequentially),
    or in float32 with accum_fmt=None; half_storage: every layer keeps what it saved for backward in 2 bytes
    where its values are float16 values (``storage.HalfStoredActivations``: exact, training unchanged)."""
    if scaler is None:
        scaler = EnhancedLossScaler([(0, 2.0**10)])
    accumulation = None if accum_fmt is None else LowpAccumulation(accum_fmt, chunk, operand_fmt=fmt)
    trainer = MixedPrecisionTrainer(model, optimizer, loss_fn, fmt, grad_fmt=fmt, scaler=scaler,
                                    master_fmt=master_fmt, update_rounding="stochastic", rng=rng)
    if accumulation is not None:
        trainer.runner.attachments.append(accumulation)   # after the trainer: its products are redone first
    if half_storage:
        trainer.runner.attachments.append(HalfStoredActivations())
    return trainer


@dataclass
class StepReport:
    loss: float            # the unscaled loss of the batch
    applied: bool          # False: the gradients overflowed, the step was skipped
    grad_norm: float       # |dW| after unscaling, before clipping (Inf/NaN on a skipped step)
    scale: float           # the loss scale this step used
    grad_median: float     # median |dW_i| over all weight-gradient entries, after clipping


def train_step(trainer: MixedPrecisionTrainer, x: np.ndarray, target: np.ndarray,
               max_norm: float | None = None) -> StepReport:
    """zero_grad, forward_backward (scaled), unscale, clip to max_norm (if given), step."""
    scale = trainer.scaler.scale
    trainer.optimizer.zero_grad()
    loss = trainer.forward_backward(x, target)
    found_inf = trainer.unscale()
    grads = [p.grad for p in trainer.params]
    if max_norm is None or found_inf:
        norm = math.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads))
    else:
        norm = clip_grad_norm_(grads, max_norm)
    median = float(np.median(np.abs(np.concatenate([g.ravel() for g in grads]))))
    return StepReport(loss, trainer.step(found_inf), norm, scale, median)


def train_batches(trainer: MixedPrecisionTrainer, x: np.ndarray, target: np.ndarray, batches,
                  max_norm: float | None = None) -> list[StepReport]:
    """train_step on x[index], target[index] for each index array in ``batches``; one report per step."""
    return [train_step(trainer, x[index], target[index], max_norm) for index in batches]
