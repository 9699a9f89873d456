"""CausalSelfAttention and TransformerBlock: forward, input gradient and every parameter gradient against
torch autograd (float64, relative error < 1e-9) and finite differences with a random upstream gradient;
causal and unmasked; T = 1; dropout; bad input."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import nn
from minidist.nn.gradcheck import gradcheck

seeds = st.integers(0, 2**32 - 1)


@pytest.mark.parametrize("causal", [True, False])
@given(b=st.integers(1, 3), t=st.integers(1, 6), heads=st.integers(1, 4), d_head=st.integers(1, 4),
       seed=seeds)
def test_attention_matches_torch(causal, b, t, heads, d_head, seed):
    pytest.importorskip("torch")
    from tests.nn import torch_transformer as tt

    rng = np.random.default_rng(seed)
    d = heads * d_head
    layer = nn.CausalSelfAttention(d, heads, causal=causal, rng=rng, dtype=np.float64)
    x = rng.standard_normal((b, t, d))
    tt.compare(layer, tt.Attention(d, heads, causal), x, rng.standard_normal((b, t, d)))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("t", [1, 4])
def test_attention_finite_differences(causal, t):
    rng = np.random.default_rng(t)
    layer = nn.CausalSelfAttention(6, 2, causal=causal, rng=rng, dtype=np.float64)
    assert max(gradcheck(layer, rng.standard_normal((2, t, 6)), rng).values()) < 1e-6


def test_attention_is_causal_and_per_head_contiguous():
    """Changing a later position leaves earlier outputs unchanged; head j reads channels j·d_k …"""
    rng = np.random.default_rng(0)
    layer = nn.CausalSelfAttention(8, 2, rng=rng, dtype=np.float64)
    x = rng.standard_normal((1, 5, 8))
    y = layer.forward(x)
    x2 = x.copy()
    x2[0, 3] += 1.0
    np.testing.assert_array_equal(layer.forward(x2)[0, :3], y[0, :3])
    assert layer._probs.shape == (1, 2, 5, 5) and layer._q.shape == (1, 2, 5, 4)
    q = x2 @ layer.qkv.weight.data[:8].T + layer.qkv.bias.data[:8]
    np.testing.assert_allclose(layer._q[0, 1], q[0, :, 4:], rtol=1e-13)


def test_attention_dropout_finite_differences_with_a_replayed_mask():
    rng = np.random.default_rng(5)
    layer = nn.CausalSelfAttention(4, 2, dropout=0.3, rng=rng, dtype=np.float64)

    def same_masks():
        layer.attn_drop.rng, layer.resid_drop.rng = np.random.default_rng(1), np.random.default_rng(2)

    assert max(gradcheck(layer, rng.standard_normal((2, 3, 4)), rng,
                         before_forward=same_masks).values()) < 1e-6
    assert np.any(layer.attn_drop._scaled_mask == 0)  # the mask did drop something


@given(b=st.integers(1, 2), t=st.integers(1, 5), heads=st.integers(1, 3), d_head=st.integers(2, 3),
       seed=seeds)
def test_block_matches_torch(b, t, heads, d_head, seed):
    """d >= 2: LayerNorm over a single channel outputs exactly its bias (x̂ = 0), nothing to compare."""
    pytest.importorskip("torch")
    from tests.nn import torch_transformer as tt

    rng = np.random.default_rng(seed)
    d = heads * d_head
    layer = nn.TransformerBlock(d, heads, rng=rng, dtype=np.float64)
    tt.compare(layer, tt.Block(d, heads), rng.standard_normal((b, t, d)), rng.standard_normal((b, t, d)))


@pytest.mark.parametrize("t", [1, 3])
def test_block_finite_differences(t):
    rng = np.random.default_rng(t)
    layer = nn.TransformerBlock(4, 2, d_ff=6, rng=rng, dtype=np.float64)
    assert max(gradcheck(layer, rng.standard_normal((2, t, 4)), rng).values()) < 1e-6


def test_block_exposes_its_sub_layers_in_order():
    block = nn.TransformerBlock(8, 2, rng=np.random.default_rng(0))
    assert [type(m).__name__ for m in block.mlp] == ["Linear", "GELU", "Linear"]
    assert block.mlp[0].out_features == 32 and block.attn.qkv.out_features == 24
    expected = [*block.ln1.parameters(), *block.attn.parameters(),
                *block.ln2.parameters(), *block.mlp.parameters()]
    assert [id(p) for p in block.parameters()] == [id(p) for p in expected]


def test_attention_and_block_bad_input_change_nothing():
    with pytest.raises(ValueError, match="divisible by n_heads"):
        nn.CausalSelfAttention(6, 4)
    with pytest.raises(ValueError, match="divisible by n_heads"):
        nn.TransformerBlock(6, 4)
    rng = np.random.default_rng(0)
    for layer in (nn.CausalSelfAttention(4, 2, rng=rng, dtype=np.float64),
                  nn.TransformerBlock(4, 2, rng=rng, dtype=np.float64)):
        layer.forward(rng.standard_normal((1, 2, 4)))
        saved = [(m, dict(vars(m))) for m in layer.modules()]
        with pytest.raises(ValueError, match=r"\(B, T, 4\)"):
            layer.forward(rng.standard_normal((1, 2, 5)))
        with pytest.raises(ValueError, match="3 dimensions"):
            layer.forward(rng.standard_normal((2, 4)))
        with pytest.raises(TypeError, match="float"):
            layer.forward(np.ones((1, 2, 4), np.int64))
        assert all(vars(m) == before for m, before in saved)


def test_checkpointed_block_is_bitwise_the_plain_block_with_dropout():
    """Checkpoint(TransformerBlock) keeps only its input and recomputes (the dropout masks replayed)."""
    import copy

    from minidist.sim.memory import held_bytes

    data = np.random.default_rng(9)
    block = nn.TransformerBlock(8, 2, dropout=0.2, rng=np.random.default_rng(0), dtype=np.float64)
    checkpointed = nn.Checkpoint(copy.deepcopy(block))
    x, dy = data.standard_normal((2, 5, 8)), data.standard_normal((2, 5, 8))
    assert np.array_equal(block.forward(x), checkpointed.forward(x))
    assert held_bytes(checkpointed)["activations"] == x.nbytes < held_bytes(block)["activations"]
    assert np.array_equal(block.backward(dy), checkpointed.backward(dy))
    for p, q in zip(block.parameters(), checkpointed.parameters(), strict=True):
        assert np.array_equal(p.grad, q.grad)
