"""int8 inference: symmetric per-channel weights, symmetric per-tensor activations, integer accumulation.

The Catanzaro slides ("Arithmetic: mixed precision for training, lower precision integer for inference,
Int8") and the accelerator slides (TPU v1: 8-bit multiply-accumulate units; Turing tensor cores:
int8/int4/int1). For a Linear or Conv2d layer with weight W (out channel c first) and input x:

    s_W[c] = max|W[c]| / 127,  W_q[c] = round(W[c] / s_W[c])  ∈ [−127, 127]       per output channel
    s_x    = max|x| / 127 over a calibration batch,  x_q = clip(round(x / s_x), −127, 127)   per tensor
    y[…, c] ≈ s_x · s_W[c] · (x_q ⊛ W_q)[…, c] + b[c]

x_q ⊛ W_q is a sum of int8·int8 products — an int32 accumulator in hardware. Here it runs through the
float layer's own forward on integer-valued float64 arrays: every product (< 2^14) and sum (< 2^53) is an
exact integer, so the result is the integer accumulator bit for bit (checked). The bias stays FP32 and
the layers between (ReLU, pooling, Flatten, norms) run in floating point. Weights: 1 byte instead of 4,
plus one FP32 scale per output channel.
"""

from __future__ import annotations

import copy

import numpy as np

from minidist.nn import Conv2d, Linear, Module, Sequential
from minidist.nn.checks import check_real, check_real_array
from minidist.nn.module import check_float_array

QMAX = 127


def quantize_symmetric(x: np.ndarray, scale) -> np.ndarray:
    """round(x / scale) clipped to [−127, 127], as int8 (scale broadcasts against x)."""
    return np.clip(np.rint(np.asarray(x, np.float64) / scale), -QMAX, QMAX).astype(np.int8)


def per_channel_scales(w: np.ndarray) -> np.ndarray:
    """max|W[c]| / 127 for each output channel c (axis 0); an all-zero channel gets scale 1."""
    check_float_array(w, "per_channel_scales weight")
    check_real_array(w, "per_channel_scales weight", finite=True)    # NaN would hide in max, inf zero all
    peak = np.abs(w.reshape(w.shape[0], -1)).max(axis=1).astype(np.float64)
    return np.where(peak > 0, peak, QMAX) / QMAX


def per_tensor_scale(x: np.ndarray) -> float:
    """max|x| / 127 (1 when x is all zero)."""
    check_float_array(x, "per_tensor_scale input")
    check_real_array(x, "per_tensor_scale input", finite=True)
    peak = float(np.abs(x).max(initial=0.0))
    return (peak if peak > 0 else QMAX) / QMAX


class Int8Layer(Module):
    """A Linear or Conv2d for inference with int8 weights (per channel) and int8 inputs (per tensor)."""

    def __init__(self, layer: Linear | Conv2d, input_scale: float):
        if not isinstance(layer, (Linear, Conv2d)):
            raise TypeError(f"Int8Layer quantises Linear or Conv2d, got {type(layer).__name__}")
        self.input_scale = check_real(input_scale, "Int8Layer input_scale", 0.0, strict=True)
        self.weight_scale = per_channel_scales(layer.weight.data).astype(np.float32)
        shape = (-1,) + (1,) * (layer.weight.data.ndim - 1)
        self.weight_q = quantize_symmetric(layer.weight.data, self.weight_scale.reshape(shape))
        self.bias = None if layer.bias is None else layer.bias.data.astype(np.float32)
        self._integer = copy.deepcopy(layer)             # the same layer computing x_q ⊛ W_q exactly
        self._integer.weight.data = self.weight_q.astype(np.float64)
        self._integer.bias = None
        self._channel_axis = -1 if isinstance(layer, Linear) else 1

    def accumulate(self, x: np.ndarray) -> np.ndarray:
        """The integer accumulator x_q ⊛ W_q (int64 array; int32 suffices for these sizes)."""
        acc = self._integer.forward(quantize_symmetric(x, self.input_scale).astype(np.float64))
        return acc.astype(np.int64)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (the float layer's input shape) → y (its output shape), float32. A NaN or ±inf in x is a
        ValueError: int8 has no such values, and clipping them would give a finite, wrong answer."""
        check_float_array(x, "Int8Layer input")
        check_real_array(x, "Int8Layer input", finite=True)
        acc = self.accumulate(x)
        shape = [1] * acc.ndim
        shape[self._channel_axis] = -1
        y = acc * (self.input_scale * self.weight_scale.astype(np.float64)).reshape(shape)
        if self.bias is not None:
            y = y + self.bias.reshape(shape)
        self.remember_output_shape(y.shape)
        return y.astype(np.float32)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        raise NotImplementedError("Int8Layer is for inference only (train in floating point, then quantise)")

    def weight_bytes(self) -> int:
        """Bytes of the stored weight: int8 values plus one FP32 scale per output channel."""
        return self.weight_q.nbytes + self.weight_scale.nbytes


def quantize_model(model: Sequential, calibration_x: np.ndarray) -> Sequential:
    """A copy of the (trained, eval-mode) model with every Linear and Conv2d replaced by an Int8Layer
    whose input scale is calibrated on the activations ``calibration_x`` produces at that layer."""
    if not isinstance(model, Sequential):
        raise TypeError(f"quantize_model expects a Sequential, got {type(model).__name__}")
    check_float_array(calibration_x, "quantize_model calibration_x")
    layers, x = [], calibration_x
    for layer in model:
        layers.append(Int8Layer(layer, per_tensor_scale(x)) if isinstance(layer, (Linear, Conv2d))
                      else copy.deepcopy(layer))
        x = layer.forward(x)
    return Sequential(*layers)


def weight_bytes(model: Sequential) -> tuple[int, int]:
    """(bytes of the Linear/Conv2d weights as stored, the same weights in FP32)."""
    stored = fp32 = 0
    for layer in model:
        if isinstance(layer, Int8Layer):
            stored, fp32 = stored + layer.weight_bytes(), fp32 + layer.weight_q.size * 4
        elif isinstance(layer, (Linear, Conv2d)):
            stored, fp32 = stored + layer.weight.data.nbytes, fp32 + layer.weight.data.size * 4
    return stored, fp32
