"""Mixed precision for transformers: the rule "matmuls in FP16/BF16; softmax, LayerNorm and the loss in FP32".

The NVIDIA mixed-precision slides ("Hardware Accelerators for Training DNNs"): FP32 math is recommended
for operations f with |f(x)| ≫ |x| (exp, square, log, cross-entropy) and for reductions (sums, norms,
softmax) — "Loss, probability layers: softmax, cross-entropy, attention modules: FP32 math, FP32 output";
FP16 is safe for pointwise ops on values near 0 (add, scale, GELU) and matrix products accumulate in FP32.

``mixed_forward(model, tokens, fmt, policy)`` evaluates a GPT's logits with every value emulated:
    matmul      operands rounded to fmt, products summed in FP32, result rounded to fmt   (tensor cores)
    pointwise   embeddings, residual adds, GELU: computed, then rounded to fmt
    reductions  policy "rule": softmax and LayerNorm in FP32 (input upcast, output rounded to fmt where
                a matmul reads it next); policy "lowp": every step of them rounded to fmt; "lowp-nomax"
                as "lowp" without the max subtraction in softmax, so e^x overflows fmt once x > ln(max)
                (11.09 in FP16: e^11.09 ≈ 65504) and Inf/Inf gives NaN.
``mixed_cross_entropy(logits, targets, policy)`` is the loss under the same policy. Cost: as the FP32
model plus one rounding per stored value (emulation, not speed).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf

from minidist.nn.attention import causal_mask, merge_heads, split_heads
from minidist.nn.gpt import GPT
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


def _linear(x, layer, fmt):
    y = lowp_matmul_fp32_accumulate(x, layer.weight.data.T, fmt)
    return y if layer.bias is None else _q(y + layer.bias.data, fmt)


def _attention(x, attn, fmt, policy):
    q, k, v = (split_heads(a, attn.n_heads) for a in np.split(_linear(x, attn.qkv, fmt), 3, axis=-1))
    scores = lowp_matmul_fp32_accumulate(q, k.transpose(0, 1, 3, 2), fmt)
    scores = _q(scores * np.float32(1.0 / math.sqrt(attn.d_head)), fmt)
    if attn.causal:
        scores[..., causal_mask(x.shape[1])] = -np.inf
    probs = policy_softmax(scores, fmt, policy)
    return _linear(merge_heads(lowp_matmul_fp32_accumulate(probs, v, fmt)), attn.proj, fmt)


def mixed_forward(model: GPT, tokens: np.ndarray, fmt: FloatFormat, policy: str = "rule") -> np.ndarray:
    """Logits (B, T, V), float32 holding fmt values, of ``model`` (eval, no dropout) on tokens (B, T)
    with every value emulated in fmt under ``policy`` ("rule", "lowp" or "lowp-nomax")."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if not isinstance(model, GPT):
        raise TypeError(f"mixed_forward expects a minidist.nn.GPT, got {type(model).__name__}")
    model.check_tokens(tokens)
    x = _q(model.tok_emb.weight.data[tokens] + model.pos_emb.weight.data[:tokens.shape[1]], fmt)
    for block in model.blocks:
        ln = block.ln1
        x = _q(x + _attention(policy_layer_norm(x, ln.weight.data, ln.bias.data, ln.eps, fmt, policy),
                              block.attn, fmt, policy), fmt)
        ln = block.ln2
        h = _linear(policy_layer_norm(x, ln.weight.data, ln.bias.data, ln.eps, fmt, policy), block.mlp[0], fmt)
        h = _q(h * 0.5 * (1 + erf(h / math.sqrt(2))), fmt)  # GELU: pointwise, safe in fmt
        x = _q(x + _linear(h, block.mlp[2], fmt), fmt)
    ln = model.ln_f
    return _linear(policy_layer_norm(x, ln.weight.data, ln.bias.data, ln.eps, fmt, policy), model.head, fmt)


def mixed_cross_entropy(logits: np.ndarray, targets: np.ndarray, fmt: FloatFormat, policy: str = "rule") -> float:
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
