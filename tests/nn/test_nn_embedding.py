"""Embedding: the gather forward and the scatter-add backward (repeated tokens included) against torch
(float64) and finite differences; bad tokens refused before anything changes."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import nn
from minidist.nn.gradcheck import numerical_gradient, relative_error

seeds = st.integers(0, 2**32 - 1)


@given(vocab=st.integers(1, 6), dim=st.integers(1, 4), shape=st.lists(st.integers(1, 4), min_size=1,
       max_size=3).map(tuple), seed=seeds)
def test_embedding_matches_torch_and_finite_differences(vocab, dim, shape, seed):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    layer = nn.Embedding(vocab, dim, rng=rng, dtype=np.float64)
    tokens = rng.integers(0, vocab, shape)  # small vocabularies: tokens repeat
    y = layer.forward(tokens)
    dy = rng.standard_normal(y.shape)
    assert layer.backward(dy) is None
    ref = torch.nn.Embedding(vocab, dim).double()
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(layer.weight.data))
    ty = ref(torch.from_numpy(tokens))
    ty.backward(torch.from_numpy(dy))
    np.testing.assert_array_equal(y, ty.detach().numpy())
    np.testing.assert_allclose(layer.weight.grad, ref.weight.grad.numpy(), rtol=1e-12, atol=1e-15)
    numeric = numerical_gradient(lambda: float(np.sum(dy * layer.forward(tokens))), layer.weight.data)
    assert relative_error(layer.weight.grad, numeric) < 1e-7


def test_embedding_repeated_token_accumulates():
    layer = nn.Embedding(3, 2, rng=np.random.default_rng(0), dtype=np.float64)
    layer.forward(np.array([[1, 1], [1, 0]]))
    layer.backward(np.ones((2, 2, 2)))
    np.testing.assert_array_equal(layer.weight.grad, [[1, 1], [3, 3], [0, 0]])


def test_embedding_bad_input_changes_nothing():
    layer = nn.Embedding(5, 2, rng=np.random.default_rng(0), dtype=np.float64)
    layer.forward(np.array([0, 1]))
    saved = layer._tokens
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        layer.forward(np.array([0, 5]))
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        layer.forward(np.array([-1, 2]))
    with pytest.raises(TypeError, match="integer token ids"):
        layer.forward(np.array([0.0, 1.0]))
    with pytest.raises(TypeError, match="numpy array"):
        layer.forward([0, 1])
    assert layer._tokens is saved and layer._y_shape == (2, 2)
    with pytest.raises(ValueError, match="num_embeddings"):
        nn.Embedding(0, 2)
