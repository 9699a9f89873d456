"""Mixed-precision training: FP32 master weights, a low-precision copy for forward and backward.

The recipe (Micikevicius et al.; the "Hardware Accelerators for Training Deep Neural Networks" slides,
"Weight Update", "Loss Scaling"; the "Scaling Up Training" slides), one iteration:

    make an fp16 copy of the weights                  W16 = quantize(W32, fmt)
    forward in fp16                                   every layer's input and output quantized to fmt
    scale the loss by s                               dL/dlogits · s, quantized to grad_fmt
    backward in fp16                                  every layer's dx and every dW quantized to grad_fmt
    scale dW by 1/s                                   (exact: s is a power of two)
    if dW holds Inf/NaN: skip the update              (the dynamic scaler backs off)
    update W32 with the optimizer                     and optionally round W into master_fmt

Why FP32 masters: w + lr·dw in FP16 loses updates smaller than half an ulp of w (swamping). The FP8
paper (Mellempudi et al. 2019) keeps 16-bit masters and rounds the update *stochastically* so that small
updates survive on average: ``master_fmt=FP16, update_rounding="stochastic"``.

The model's own Parameters hold the masters (any optimizer on ``model.parameters()`` works unchanged);
during forward_backward their ``.data`` is swapped for the low-precision copies. The trainer is an
attachment of the step runner (minidist/nn/runner.py), so any strategy can attach it to its own runner.
Layer boundaries: between a Sequential's top-level layers, else at the model's input and output; inside a
layer, float32.
A step is split in three so data parallelism can act in between:

    loss = trainer.forward_backward(x, y)    # gradients (scaled by s) added into each master's .grad
    found_inf = trainer.unscale()            # .grad /= s; Inf/NaN on this rank?
    trainer.step(found_inf)                  # (after allreducing .grad and found_inf) skip or update
"""

from __future__ import annotations

import numpy as np

from minidist.nn.module import Module, Sequential
from minidist.nn.runner import Attachment, StepRunner, units

from .formats import FP32, FloatFormat, check_flag, check_format
from .rounding import ROUNDINGS, quantize
from .scaling import DynamicLossScaler, StaticLossScaler


class Recipe(Attachment):
    """What every mixed-precision attachment shares (MixedPrecisionTrainer here, the sharded wrappers'
    ShardedMixedPrecision): the formats and the loss scaler, checked; the casts of activations at the
    layer boundaries ``starts`` / ``ends`` (``boundaries``); the agreement on an overflow and the update."""

    def __init__(self, fmt: FloatFormat, grad_fmt: FloatFormat | None, scaler, master_fmt: FloatFormat):
        self.fmt = check_format(fmt)
        self.grad_fmt = check_format(grad_fmt if grad_fmt is not None else fmt)
        self.master_fmt = check_format(master_fmt)
        self.scaler = scaler if scaler is not None else DynamicLossScaler()
        if not isinstance(self.scaler, (StaticLossScaler, DynamicLossScaler)):
            raise TypeError("scaler must be a StaticLossScaler or DynamicLossScaler, "
                            f"got {type(scaler).__name__}")
        self.starts, self.ends = set(), set()
        self.steps_taken, self.steps_skipped = 0, 0

    def before_forward(self, i, layer, x):
        if i != 0 or np.issubdtype(np.asarray(x).dtype, np.integer):    # token ids stay integers
            return x
        return quantize(np.asarray(x, dtype=np.float32), self.fmt)

    def after_forward(self, i, layer, y):
        return quantize(y, self.fmt) if i in self.ends else y

    def _agree(self, grads: list[np.ndarray], reduce_max) -> bool:
        """Round the summed scaled gradients to grad_fmt (as an allreduce in that format delivers them),
        unscale them in place, and return found_inf of any rank through ``reduce_max(flag)``."""
        for g in grads:
            g[...] = quantize(g, self.grad_fmt)
        found_inf = self.scaler.unscale(grads)             # elementwise: the clock treats it as free
        return bool(reduce_max(np.array([float(found_inf)]))[0])

    def _apply(self, found_inf: bool, optimizer, masters: list[np.ndarray], **rounding) -> bool:
        """Skip the update if found_inf, else optimizer.step() and round the masters into master_fmt;
        update the scaler. Returns True if the update was applied."""
        if found_inf:
            self.steps_skipped += 1
        else:
            optimizer.step()
            if self.master_fmt != FP32:
                for m in masters:
                    m[...] = quantize(m, self.master_fmt, saturate=True, **rounding)
            self.steps_taken += 1
        self.scaler.update(found_inf)
        return not found_inf


class MixedPrecisionTrainer(Recipe):
    """Train ``model`` with ``optimizer`` (built on model.parameters()) in low precision.

    Args:
        model: any minidist Module; a Sequential gets quantized boundaries between its layers.
        optimizer: any minidist optimizer over model.parameters() (it updates the FP32 masters).
        loss_fn: e.g. CrossEntropyLoss(); computed in float32 from the low-precision logits.
        fmt: format of weights and activations in forward/backward (FP16, BF16, FP8_E5M2...).
        grad_fmt: format of activation and weight gradients (default: fmt).
        scaler: StaticLossScaler / DynamicLossScaler; default DynamicLossScaler() (GradScaler's defaults).
        master_fmt: format the masters are rounded to after each update (FP32 = no rounding).
        update_rounding: "nearest" or "stochastic" for that rounding (stochastic needs rng).
        rng: numpy Generator for stochastic rounding.
    """

    def __init__(self, model: Module, optimizer, loss_fn, fmt: FloatFormat, *,
                 grad_fmt: FloatFormat | None = None, scaler=None, master_fmt: FloatFormat = FP32,
                 update_rounding: str = "nearest", rng: np.random.Generator | None = None):
        if not isinstance(model, Module):
            raise TypeError(f"model must be a minidist Module, got {type(model).__name__}")
        for name in ("step", "zero_grad"):
            if not callable(getattr(optimizer, name, None)):
                raise TypeError(f"optimizer must have .{name}(), got {type(optimizer).__name__}")
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        super().__init__(fmt, grad_fmt, scaler, master_fmt)
        if update_rounding not in ROUNDINGS:
            raise ValueError(f"update_rounding must be one of {ROUNDINGS}, got {update_rounding!r}")
        if update_rounding == "stochastic" and rng is None:
            raise ValueError("update_rounding='stochastic' needs rng=np.random.default_rng(seed)")
        if rng is not None and not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy Generator (np.random.default_rng(seed)), "
                            f"got {type(rng).__name__} {rng!r}")
        self.update_rounding, self.rng = update_rounding, rng
        self.params = model.parameters()
        for p in self.params:
            if p.data.dtype != np.float32:
                raise TypeError(f"master weights must be float32, got {p.data.dtype}")
        self.runner = StepRunner(model, loss_fn, [self])
        self.starts, self.ends = boundaries(model)

    # -- forward and backward in low precision: attached to the step runner -----------------------------
    def forward(self, x: np.ndarray) -> np.ndarray:
        """Low-precision forward pass (weights and activations in fmt); returns the float32 logits."""
        return self.runner.forward(x)

    def forward_backward(self, x: np.ndarray, target: np.ndarray) -> float:
        """Forward, loss, backward of the loss scaled by s; adds s·dW (in grad_fmt) into each .grad.

        Returns the (unscaled) loss. Gradients accumulate, as in backward(): call zero_grad first.
        """
        self.runner.loss_fn = self.loss_fn
        return self.runner.forward_backward(x, target)

    # the runner's events (see minidist/nn/runner.py). A pipeline stage runs forward passes (begin ... end)
    # and, later, backward passes alone (begin_backward ... end_backward): the working copy is swapped in
    # for each.
    def begin(self, runner) -> None:
        """Swap in the low-precision working copy."""
        self._masters = [p.data for p in self.params]
        for p in self.params:
            p.data = quantize(p.data, self.fmt, saturate=True)
        # overflow to Inf (and Inf − Inf = NaN) is expected: unscale() reports it, step() skips
        self._errors = np.seterr(over="ignore", invalid="ignore")

    def after_loss(self, dy):
        """dL/dlogits · s in grad_fmt (a pipeline fires it on its last stage)."""
        return quantize(dy * np.float32(self.scaler.scale), self.grad_fmt)

    def begin_backward(self, last: bool) -> None:
        """Keep the gradients accumulated so far aside: this pass's dW is rounded alone, then added."""
        self._backward_alone = getattr(self, "_masters", None) is None
        if self._backward_alone:              # a stage's backward, outside begin ... end
            self.begin(None)
        self._earlier = {}
        for p in self.params:
            self._earlier[id(p)] = p.grad.copy()
            p.grad[...] = 0

    def after_backward(self, i, layer, dx):
        for p in layer.parameters():          # dW leaves the layer in grad_fmt
            p.grad[...] = self._earlier[id(p)] + quantize(p.grad, self.grad_fmt)
        return quantize(dx, self.grad_fmt) if dx is not None and i in self.starts else dx

    def end_backward(self) -> None:
        if self._backward_alone:
            self.end()

    def end(self) -> None:
        """Put the masters back, also when a layer raised."""
        for p, master in zip(self.params, self._masters):
            p.data = master
        self._masters = None
        np.seterr(**self._errors)

    def unscale(self) -> bool:
        """Divide every .grad by the loss scale in place; True if any gradient is Inf/NaN (this rank)."""
        return self.scaler.unscale([p.grad for p in self.params])

    def agree(self, reduce_max) -> bool:
        """After the scaled gradients were summed over ranks: round the sums to grad_fmt (as an allreduce
        in that format delivers them), unscale, and return found_inf of any rank, through
        ``reduce_max(flag)`` (e.g. an allreduce with max of a 1-element array), so every rank skips alike."""
        return self._agree([p.grad for p in self.params], reduce_max)

    def step(self, found_inf: bool) -> bool:
        """Skip the update if found_inf, else optimizer.step() and round the masters; update the scaler.

        Returns True if the update was applied. In data parallelism found_inf must be the same on every
        rank (allreduce it with max), or the replicas drift apart.
        """
        return self._apply(check_flag(found_inf, "found_inf"), self.optimizer, [p.data for p in self.params],
                           rounding=self.update_rounding, rng=self.rng)

    def train_step(self, x: np.ndarray, target: np.ndarray) -> tuple[float, bool]:
        """zero_grad, forward_backward, unscale, step: returns (loss, applied)."""
        self.optimizer.zero_grad()
        loss = self.forward_backward(x, target)
        return loss, self.step(self.unscale())


class FullPrecision(Attachment):
    """The plain-precision counterpart of MixedPrecisionTrainer for a strategy: nothing is cast or
    scaled, no gradient overflows, step() is the optimizer's."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def agree(self, reduce_max) -> bool:
        return False

    def step(self, found_inf: bool) -> bool:
        self.optimizer.step()
        return True


def boundaries(model: Module) -> tuple[set[int], set[int]]:
    """Where activations are rounded: the runner's unit indices that start and end a top-level layer
    of a Sequential (nested Sequentials stay float32 inside), else the model's input and output."""
    starts, ends, first = set(), set(), 0
    for layer in (list(model) if isinstance(model, Sequential) else [model]):
        starts.add(first)
        first += len(units(layer))
        ends.add(first - 1)
    return starts, ends
