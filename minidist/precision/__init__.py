"""Low precision: FP16/BF16/FP8 formats, exact rounding (nearest-even, stochastic), loss scaling,
mixed-precision training and low-precision matrix multiplication."""

from .bits import decode, encode
from .formats import BF16, FP8_E4M3, FP8_E5M2, FP16, FP32, FloatFormat
from .gemm import lowp_dot, lowp_matmul
from .mixed import MixedPrecisionTrainer
from .rounding import quantize, stochastic_round
from .scaling import DynamicLossScaler, StaticLossScaler

__all__ = ["BF16", "FP8_E4M3", "FP8_E5M2", "FP16", "FP32", "DynamicLossScaler", "FloatFormat",
           "MixedPrecisionTrainer", "StaticLossScaler", "decode", "encode", "lowp_dot", "lowp_matmul",
           "quantize", "stochastic_round"]
