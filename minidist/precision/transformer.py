"""Mixed precision for transformers: the rule "matmuls in FP16/BF16; softmax, LayerNorm and the loss in FP32".

The NVIDIA mixed-precision slides ("Hardware Accelerators for Training DNNs"): FP32 math is recommended
for operations f with |f(x)| ≫ |x| (exp, square, log, cross-entropy) and for reductions (sums, norms,
softmax) — "Loss, probability layers: softmax, cross-entropy, attention modules: FP32 math, FP32 output";
FP16 is safe for pointwise ops on values near 0 (add, scale, GELU) and matrix products accumulate in FP32.

``mixed_forward(model, tokens, fmt, policy)`` evaluates a GPT's logits with every value emulated, by running
the model's own chain (nn.GPT.units, through the step runner) on a copy whose layers compute in fmt:
    matmul      Linear -> LowPrecisionLinear: operands rounded to fmt, products summed in FP32, result
                rounded to fmt (tensor cores); attention's q·kᵀ and P·v the same (PolicyAttention)
    pointwise   GELU -> Rounded(GELU); the embeddings' sum and each block's output (the residual stream)
                are rounded by the RoundOutputs attachment after each unit
    reductions  LayerNorm -> PolicyLayerNorm, attention's softmax -> policy_softmax: policy "rule" in FP32
                (input upcast, output rounded to fmt where a matmul reads it next); "lowp": every step of
                them rounded to fmt; "lowp-nomax" as "lowp" without the max subtraction in softmax, so e^x
                overflows fmt once x > ln(max) (11.09 in FP16: e^11.09 ≈ 65504) and Inf/Inf gives NaN.
``mixed_cross_entropy(logits, targets, policy)`` is the loss under the same policy. Cost: as the FP32
model plus one rounding per stored value (emulation, not speed; forward only).
"""

from __future__ import annotations

import copy
import math

import numpy as np

from minidist.nn import GPT, Module, Sequential
from minidist.nn.attention import causal_mask, merge_heads, split_heads
from minidist.nn.runner import Attachment, StepRunner
from minidist.nn.softmax import log_softmax, softmax

from .formats import FloatFormat
from .rounding import quantize

POLICIES = ("rule", "lowp", "lowp-nomax")


def _q(x, fmt: FloatFormat) -> np.ndarray:
    return quantize(np.asarray(x, dtype=np.float32), fmt)


def lowp_matmul_fp32_accumulate(a: np.ndarray, b: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """a (..., M, K) @ b (..., K, N) with operands in fmt, FP32 accumulation, the result rounded to fmt."""
    return _q(_q(a, fmt) @ _q(b, fmt), fmt)


def policy_softmax(x: np.ndarray, fmt: FloatFormat, policy: str) -> np.ndarray:
    """Softmax along the last axis under ``policy`` (module docstring); masked entries are −inf."""
    if policy == "rule":
        return softmax(x.astype(np.float32), axis=-1)
    shifted = _q(x - x.max(axis=-1, keepdims=True), fmt) if policy == "lowp" else _q(x, fmt)
    with np.errstate(over="ignore", invalid="ignore"):
        e = _q(np.exp(shifted), fmt)                              # overflows to Inf without the shift
        return _q(e / _q(e.sum(axis=-1, keepdims=True), fmt), fmt)  # Inf / Inf = NaN


def policy_layer_norm(x: np.ndarray, weight, bias, eps: float, fmt: FloatFormat, policy: str) -> np.ndarray:
    """LayerNorm over the last axis: in FP32 ("rule"), or with every step rounded to fmt; output in fmt."""
    if policy == "rule":
        x32 = x.astype(np.float32)
        mean, var = x32.mean(-1, keepdims=True), x32.var(-1, keepdims=True)
        return _q((x32 - mean) / np.sqrt(var + eps) * weight + bias, fmt)
    mean = _q(x.mean(-1, keepdims=True), fmt)
    centred = _q(x - mean, fmt)
    with np.errstate(over="ignore", invalid="ignore"):
        var = _q(_q(centred * centred, fmt).mean(-1, keepdims=True), fmt)  # squares overflow past 256
        return _q(_q(centred / _q(np.sqrt(var + eps), fmt), fmt) * _q(weight, fmt) + _q(bias, fmt), fmt)


class LowPrecisionLinear(Module):
    """``layer`` (a Linear) computing y = q(q(x)·q(W)ᵀ) + b, rounded to fmt (forward only)."""

    def __init__(self, layer, fmt: FloatFormat):
        self.layer, self.fmt = layer, fmt

    def forward(self, x: np.ndarray) -> np.ndarray:
        y = lowp_matmul_fp32_accumulate(x, self.layer.weight.data.T, self.fmt)
        return y if self.layer.bias is None else _q(y + self.layer.bias.data, self.fmt)


class Rounded(Module):
    """``inner`` (a pointwise layer, e.g. GELU: safe in fmt) with its output rounded to fmt."""

    def __init__(self, inner: Module, fmt: FloatFormat):
        self.inner, self.fmt = inner, fmt

    def forward(self, x: np.ndarray) -> np.ndarray:
        return _q(self.inner.forward(x), self.fmt)


class PolicyLayerNorm(Module):
    """``ln`` (a LayerNorm over the last axis) under ``policy``: policy_layer_norm."""

    def __init__(self, ln, fmt: FloatFormat, policy: str):
        self.ln, self.fmt, self.policy = ln, fmt, policy

    def forward(self, x: np.ndarray) -> np.ndarray:
        ln = self.ln
        return policy_layer_norm(x, ln.weight.data, ln.bias.data, ln.eps, self.fmt, self.policy)


class PolicyAttention(Module):
    """``attn`` (an nn.CausalSelfAttention) with its products in fmt and its softmax under ``policy``:
    q, k, v = LowPrecisionLinear(qkv)(x); P = policy_softmax(q(q·kᵀ)·(1/√d_k)); y = proj(q(P·v))."""

    def __init__(self, attn, fmt: FloatFormat, policy: str):
        self.attn, self.fmt, self.policy = attn, fmt, policy
        self.qkv, self.proj = LowPrecisionLinear(attn.qkv, fmt), LowPrecisionLinear(attn.proj, fmt)

    def forward(self, x: np.ndarray) -> np.ndarray:
        attn, fmt = self.attn, self.fmt
        q, k, v = (split_heads(a, attn.n_heads) for a in np.split(self.qkv.forward(x), 3, axis=-1))
        scores = lowp_matmul_fp32_accumulate(q, k.transpose(0, 1, 3, 2), fmt)
        scores = _q(scores * np.float32(1.0 / math.sqrt(attn.d_head)), fmt)
        if attn.causal:
            scores[..., causal_mask(x.shape[1])] = -np.inf
        probs = policy_softmax(scores, fmt, self.policy)
        return self.proj.forward(merge_heads(lowp_matmul_fp32_accumulate(probs, v, fmt)))


class RoundOutputs(Attachment):
    """Rounds every unit's output to fmt (the embeddings' sum, each block's residual stream)."""

    def __init__(self, fmt: FloatFormat):
        self.fmt = fmt

    def after_forward(self, i: int, layer: Module, y: np.ndarray) -> np.ndarray:
        return _q(y, self.fmt)


def emulated(model: GPT, fmt: FloatFormat, policy: str) -> GPT:
    """A shallow copy of ``model`` (sharing its Parameters) whose Linears, attention, LayerNorms and GELUs
    compute in fmt under ``policy``; its forward is GPT's own chain (the embeddings stay lookups)."""
    copy_ = copy.copy(model)
    copy_.blocks = []
    for block in model.blocks:
        b = copy.copy(block)
        first, activation, second = list(block.mlp)
        b.ln1, b.ln2 = PolicyLayerNorm(block.ln1, fmt, policy), PolicyLayerNorm(block.ln2, fmt, policy)
        b.attn = PolicyAttention(block.attn, fmt, policy)
        b.mlp = Sequential(LowPrecisionLinear(first, fmt), Rounded(activation, fmt),
                           LowPrecisionLinear(second, fmt))
        copy_.blocks.append(b)
    copy_.ln_f, copy_.head = PolicyLayerNorm(model.ln_f, fmt, policy), LowPrecisionLinear(model.head, fmt)
    return copy_


def mixed_forward(model: GPT, tokens: np.ndarray, fmt: FloatFormat, policy: str = "rule") -> np.ndarray:
    """Logits (B, T, V), float32 holding fmt values, of ``model`` (eval, no dropout) on tokens (B, T)
    with every value emulated in fmt under ``policy`` ("rule", "lowp" or "lowp-nomax")."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if not isinstance(model, GPT):
        raise TypeError(f"mixed_forward expects a minidist.nn.GPT, got {type(model).__name__}")
    model.check_tokens(tokens)
    return StepRunner(emulated(model, fmt, policy), attachments=[RoundOutputs(fmt)]).forward(tokens)


def mixed_cross_entropy(logits: np.ndarray, targets: np.ndarray, fmt: FloatFormat,
                        policy: str = "rule") -> float:
    """Mean cross-entropy of logits (..., V) against integer targets (...): in FP32 with the stable
    log-softmax ("rule"), or through policy_softmax in fmt and a log ("lowp", "lowp-nomax")."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if policy == "rule":
        log_p = log_softmax(logits.astype(np.float32), axis=-1)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            log_p = _q(np.log(policy_softmax(logits, fmt, policy)), fmt)
    picked = np.take_along_axis(log_p, targets[..., None], axis=-1)
    return float(-picked.mean())
