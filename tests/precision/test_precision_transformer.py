"""Mixed precision for transformers: the rule's path (FP16/BF16 matmuls, FP32 softmax, LayerNorm and loss)
tracks FP32; FP16 softmax without the max subtraction overflows into NaN on large logits."""

import numpy as np
import pytest

from minidist import nn
from minidist.precision import BF16, FP16, FP32, quantize
from minidist.precision import transformer as tf

lowp_matmul_fp32_accumulate, mixed_cross_entropy = tf.lowp_matmul_fp32_accumulate, tf.mixed_cross_entropy
mixed_forward, policy_softmax = tf.mixed_forward, tf.policy_softmax


def _model_and_tokens(seed=0):
    rng = np.random.default_rng(seed)
    model = nn.GPT(11, 8, 2, 16, 4, rng=rng).eval()
    return model, rng.integers(0, 11, (2, 8))


@pytest.mark.parametrize("policy", ["rule", "lowp", "lowp-nomax"])
def test_fp32_emulation_is_the_model_itself(policy):
    model, tokens = _model_and_tokens()
    np.testing.assert_allclose(mixed_forward(model, tokens, FP32, policy), model.forward(tokens),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt, tol", [(FP16, 5e-3), (BF16, 3e-2)])
def test_rule_path_tracks_fp32(fmt, tol):
    model, tokens = _model_and_tokens(1)
    ref = model.forward(tokens)
    logits = mixed_forward(model, tokens, fmt, "rule")
    assert np.array_equal(quantize(logits, fmt), logits)  # every stored value is a value of fmt
    assert np.abs(logits - ref).max() / np.abs(ref).max() < tol
    targets = np.roll(tokens, -1, axis=1)
    loss = nn.CrossEntropyLoss()(ref, targets)
    assert mixed_cross_entropy(logits, targets, fmt, "rule") == pytest.approx(loss, rel=tol)


def test_fp16_softmax_without_the_max_overflows_and_the_rule_does_not():
    logits = np.array([[12.0, 3.0, -1.0], [2.0, 1.0, 0.0]], dtype=np.float32)  # e^12 > 65504
    naive = policy_softmax(logits, FP16, "lowp-nomax")
    assert np.isnan(naive[0]).any() and np.all(np.isfinite(naive[1]))
    expected = nn.softmax(logits.astype(np.float64))
    np.testing.assert_allclose(policy_softmax(logits, FP16, "rule"), expected, rtol=1e-6)
    np.testing.assert_allclose(policy_softmax(logits, FP16, "lowp"), expected, rtol=2e-3, atol=1e-4)
    targets = np.array([0, 1])
    assert np.isnan(mixed_cross_entropy(logits, targets, FP16, "lowp-nomax"))
    assert mixed_cross_entropy(logits, targets, FP16, "rule") == pytest.approx(
        nn.CrossEntropyLoss()(logits.astype(np.float64), targets), rel=1e-6)


def test_lowp_matmul_rounds_operands_and_result():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    c = lowp_matmul_fp32_accumulate(a, b, FP16)
    qa, qb = quantize(a.astype(np.float32), FP16), quantize(b.astype(np.float32), FP16)
    np.testing.assert_array_equal(c, quantize(qa @ qb, FP16))


def test_mixed_forward_bad_input():
    model, tokens = _model_and_tokens()
    with pytest.raises(ValueError, match="policy"):
        mixed_forward(model, tokens, FP16, "fp8")
    with pytest.raises(TypeError, match="GPT"):
        mixed_forward(nn.Linear(2, 2), tokens, FP16)
    with pytest.raises(ValueError, match="block_size"):
        mixed_forward(model, np.zeros((1, 9), np.int64), FP16)
    with pytest.raises(ValueError, match="policy"):
        mixed_cross_entropy(np.zeros((1, 2)), np.zeros(1, np.int64), FP16, "none")
