"""Embedding: a lookup table of learned vectors, one row per token id.

Shapes (PyTorch's names): weight W (num_embeddings V, embedding_dim d); tokens t, integers in [0, V), any
shape S; y = W[t], shape (*S, d).

Forward:   y[s]  = W[t[s]]                      (a gather: no arithmetic)
Backward:  dW[v] += Σ_{s : t[s] = v} dy[s]      (a scatter-add: a token that occurs twice gets both rows)
           no gradient for the integer tokens   (backward returns None)

Equivalent to onehot(t) · W, without forming the (N, V) one-hot matrix. Cost: N·d reads forward, N·d adds
backward (N = number of tokens).
"""

from __future__ import annotations

import numpy as np

from minidist.nn.checks import check_count

from .module import Module, Parameter, resolve_rng


def check_tokens(tokens, high: int, what: str) -> np.ndarray:
    """tokens must be an integer ndarray with values in [0, high); returns it (raises before any change)."""
    if not isinstance(tokens, np.ndarray):
        raise TypeError(f"{what}: expected a numpy array of integer token ids, got {type(tokens).__name__}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise TypeError(f"{what}: expected integer token ids, got dtype {tokens.dtype}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= high):
        raise ValueError(f"{what}: token ids must lie in [0, {high}), "
                         f"got range [{tokens.min()}, {tokens.max()}]")
    return tokens


class Embedding(Module):
    """y = weight[tokens] (torch.nn.Embedding); weight initialised N(0, 1) as torch does."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, rng: np.random.Generator | None = None,
                 dtype=np.float32):
        check_count(num_embeddings, "Embedding num_embeddings")
        check_count(embedding_dim, "Embedding embedding_dim")
        rng = resolve_rng(rng)
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.weight = Parameter(rng.standard_normal((self.num_embeddings, self.embedding_dim)).astype(dtype))
        self._tokens: np.ndarray | None = None

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """tokens: integer ids in [0, num_embeddings), any shape S; returns y, shape (*S, embedding_dim)."""
        check_tokens(tokens, self.num_embeddings, "Embedding input")
        self._tokens = tokens
        self.remember_output_shape((*tokens.shape, self.embedding_dim))
        return self.weight.data[tokens]

    def backward(self, dy: np.ndarray) -> None:
        """dy: upstream gradient, shape (*S, embedding_dim); scatter-adds it into weight.grad (V, d).
        Returns None: integer tokens have no gradient."""
        self.check_upstream(dy)
        flat = self._tokens.reshape(-1)
        # np.add.at adds once per occurrence, so repeated tokens accumulate (weight.grad[flat] += would not)
        grad = self.weight.grad
        np.add.at(grad, flat, dy.reshape(flat.size, self.embedding_dim))
        self.weight.grad = grad   # through the setter: a partial gradient is now pending (nn.Parameter)

    def __repr__(self) -> str:
        return f"Embedding({self.num_embeddings}, {self.embedding_dim})"
