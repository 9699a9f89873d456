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
during forward_backward their ``.data`` is swapped for the low-precision copies. Layer boundaries: between
a Sequential's top-level layers, else at the model's input and output; inside a layer, float32.
A step is split in three so data parallelism can act in between:

    loss = trainer.forward_backward(x, y)    # gradients (scaled by s) added into each master's .grad
    found_inf = trainer.unscale()            # .grad /= s; Inf/NaN on this rank?
    trainer.step(found_inf)                  # (after allreducing .grad and found_inf) skip or update
"""

from __future__ import annotations

import numpy as np

from minidist.nn.module import Module, Sequential

from .formats import FP32, FloatFormat, check_flag, check_format
from .rounding import ROUNDINGS, quantize
from .scaling import DynamicLossScaler, StaticLossScaler


class MixedPrecisionTrainer:
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
        self.fmt = check_format(fmt)
        self.grad_fmt = check_format(grad_fmt if grad_fmt is not None else fmt)
        self.master_fmt = check_format(master_fmt)
        if update_rounding not in ROUNDINGS:
            raise ValueError(f"update_rounding must be one of {ROUNDINGS}, got {update_rounding!r}")
        if update_rounding == "stochastic" and rng is None:
            raise ValueError("update_rounding='stochastic' needs rng=np.random.default_rng(seed)")
        self.update_rounding, self.rng = update_rounding, rng
        self.scaler = scaler if scaler is not None else DynamicLossScaler()
        if not isinstance(self.scaler, (StaticLossScaler, DynamicLossScaler)):
            raise TypeError(f"scaler must be a StaticLossScaler or DynamicLossScaler, got {type(scaler).__name__}")
        self.params = model.parameters()
        for p in self.params:
            if p.data.dtype != np.float32:
                raise TypeError(f"master weights must be float32, got {p.data.dtype}")
        self.layers = list(model) if isinstance(model, Sequential) else [model]
        self.steps_taken = 0
        self.steps_skipped = 0

    # -- forward and backward in low precision ---------------------------------------------------------
    def forward(self, x: np.ndarray) -> np.ndarray:
        """Low-precision forward pass (weights and activations in fmt); returns the float32 logits."""
        masters = self._swap_in_working_copy()
        try:
            return self._forward(x)
        finally:
            self._restore(masters)

    def _forward(self, x: np.ndarray) -> np.ndarray:
        h = quantize(np.asarray(x, dtype=np.float32), self.fmt)
        for layer in self.layers:
            h = quantize(layer.forward(h), self.fmt)
        return h

    def forward_backward(self, x: np.ndarray, target: np.ndarray) -> float:
        """Forward, loss, backward of the loss scaled by s; adds s·dW (in grad_fmt) into each .grad.

        Returns the (unscaled) loss. Gradients accumulate, as in backward(): call zero_grad first.
        """
        masters = self._swap_in_working_copy()
        earlier = [p.grad.copy() for p in self.params]
        # overflow to Inf (and Inf − Inf = NaN) is expected here: unscale() reports it, step() skips
        with np.errstate(over="ignore", invalid="ignore"):
            try:
                for p in self.params:
                    p.grad[...] = 0
                logits = self._forward(x)
                loss = self.loss_fn.forward(logits, target)
                grad = quantize(self.loss_fn.backward() * np.float32(self.scaler.scale), self.grad_fmt)
                for layer in reversed(self.layers):
                    grad = quantize(layer.backward(grad), self.grad_fmt)
            finally:
                self._restore(masters)
            for p, before in zip(self.params, earlier):
                p.grad[...] = before + quantize(p.grad, self.grad_fmt)   # dW leaves the layer in grad_fmt
        return loss

    def unscale(self) -> bool:
        """Divide every .grad by the loss scale in place; True if any gradient is Inf/NaN (this rank)."""
        return self.scaler.unscale([p.grad for p in self.params])

    def step(self, found_inf: bool) -> bool:
        """Skip the update if found_inf, else optimizer.step() and round the masters; update the scaler.

        Returns True if the update was applied. In data parallelism found_inf must be the same on every
        rank (allreduce it with max), or the replicas drift apart.
        """
        found_inf = check_flag(found_inf, "found_inf")
        if found_inf:
            self.steps_skipped += 1
        else:
            self.optimizer.step()
            if self.master_fmt != FP32:
                for p in self.params:
                    p.data[...] = quantize(p.data, self.master_fmt, rounding=self.update_rounding,
                                           rng=self.rng, saturate=True)
            self.steps_taken += 1
        self.scaler.update(found_inf)
        return not found_inf

    def train_step(self, x: np.ndarray, target: np.ndarray) -> tuple[float, bool]:
        """zero_grad, forward_backward, unscale, step: returns (loss, applied)."""
        self.optimizer.zero_grad()
        loss = self.forward_backward(x, target)
        return loss, self.step(self.unscale())

    # -- the working copy ---------------------------------------------------------------------------------
    def _swap_in_working_copy(self) -> list[np.ndarray]:
        masters = [p.data for p in self.params]
        for p in self.params:
            p.data = quantize(p.data, self.fmt, saturate=True)
        return masters

    def _restore(self, masters: list[np.ndarray]) -> None:
        for p, master in zip(self.params, masters):
            p.data = master
