"""A small GPT: token + position embeddings, N pre-LayerNorm blocks, a final LayerNorm, a linear head.

    x0     = tok_emb(tokens) + pos_emb(0 … T−1)    tokens (B, T) int -> (B, T, d)
    x_l    = blocks[l](x_{l−1})                    l = 1 … N
    logits = head(ln_f(x_N))                       (B, T, V); head = Linear d -> V, no bias
Backward runs the same chain in reverse; the position table gets the gradient summed over the batch
(every sample uses the same rows), the token table a scatter-add. With ``tie_weights=True`` the head's
weight *is* the token table (one Parameter, listed once), so both paths add into one gradient.

The chain is ``units()``: GPTInput (the two embeddings), the blocks, ln_f, head — forward and backward
run it, the step runner steps through it and a pipeline cuts it into stages. This is the library's only
GPT chain: a split GPT (minidist.parallel's transforms) replaces sub-modules and keeps it. What a split
changes is which tokens a rank holds: ``position_ids(t)`` gives the global positions of the t tokens
forward is given (0 … t−1 in one process; a context-parallel rank's own positions).

Parameters N_params = V·d (+ V·d untied) + T_max·d + L·(12d² + 13d) + 2d. Training FLOPs per token
≈ 6·N + 12·L·T·d, N = the weights that multiply activations (blocks and head, not the embedding tables):
2N forward and 4N backward (Kaplan et al., "Scaling Laws for Neural Language Models"), plus attention's
q·kᵀ and P·v, 2·T·d each per token and layer forward, three times that with backward.
"""

from __future__ import annotations

import numpy as np

from minidist.nn.checks import check_count, check_real, check_real_array

from .activation import Dropout
from .block import TransformerBlock
from .embedding import Embedding, check_tokens
from .linear import Linear
from .module import Module, resolve_rng
from .norm import LayerNorm
from .runner import backward_through
from .softmax import softmax


class AllPositions:
    """The global positions of the t tokens a GPT is given: all of them, 0 … t−1 (one process).
    Splits of the sequence replace it (context parallelism) or wrap it (sequence parallelism)."""

    def __call__(self, t: int) -> np.ndarray:
        return np.arange(t)


class GPTInput(Module):
    """A GPT's first unit: tokens (B, T) int -> drop(tok_emb(tokens) + pos_emb(position_ids(T))), (B, T', d).

    Shares the GPT's sub-modules (no Parameters of its own) and keeps no state: the embeddings keep what
    their backward needs, so a fresh GPTInput serves each call of ``GPT.units()``. T' = T, or this rank's
    T/t tokens when a sequence-parallel embedding reduce-scatters along T.
    """

    def __init__(self, tok_emb: Module, pos_emb: Module, drop: Module, position_ids):
        self.tok_emb, self.pos_emb, self.drop, self.position_ids = tok_emb, pos_emb, drop, position_ids

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return 0                                   # a lookup and an addition: no products to count

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """tokens (B, T) int -> (B, T', d)."""
        x = self.tok_emb.forward(tokens)
        return self.drop.forward(x + self.pos_emb.forward(self.position_ids(tokens.shape[1])))

    def backward(self, dy: np.ndarray) -> None:
        """dy (B, T', d); adds into both tables' gradients; returns None (tokens have no gradient)."""
        dy = self.drop.backward(dy)
        self.tok_emb.backward(dy)
        self.pos_emb.backward(dy.sum(axis=0))      # every sample used the same rows of the position table


class GPT(Module):
    """Decoder-only language model; sub-layers ``tok_emb``, ``pos_emb``, ``drop``, ``blocks`` (a list),
    ``ln_f``, ``head`` — parameters() lists them in that order (a tied head weight once, as tok_emb's).
    Embeddings start N(0, 0.02²), as in GPT-2; the Linear layers keep torch's default initialisation."""

    def __init__(self, vocab_size: int, block_size: int, n_layers: int, d_model: int, n_heads: int, *,
                 tie_weights: bool = False, dropout: float = 0.0, rng: np.random.Generator | None = None,
                 dtype=np.float32):
        for name, size in (("vocab_size", vocab_size), ("block_size", block_size), ("n_layers", n_layers),
                           ("d_model", d_model), ("n_heads", n_heads)):
            check_count(size, f"GPT {name}")
        rng = resolve_rng(rng)
        self.vocab_size, self.block_size, self.n_layers = int(vocab_size), int(block_size), int(n_layers)
        self.d_model, self.n_heads = int(d_model), int(n_heads)
        blocks = [TransformerBlock(d_model, n_heads, dropout=dropout, rng=rng, dtype=dtype)
                  for _ in range(self.n_layers)]  # first: it validates d_model and n_heads
        self.tok_emb = Embedding(vocab_size, d_model, rng=rng, dtype=dtype)
        self.pos_emb = Embedding(block_size, d_model, rng=rng, dtype=dtype)
        for emb in (self.tok_emb, self.pos_emb):
            emb.weight.data *= emb.weight.data.dtype.type(0.02)
        self.drop = Dropout(dropout, rng=rng)
        self.blocks = blocks
        self.ln_f = LayerNorm(d_model, dtype=dtype)
        self.head = Linear(d_model, vocab_size, bias=False, rng=rng, dtype=dtype)
        self.tie_weights = bool(tie_weights)
        if self.tie_weights:
            self.head.weight = self.tok_emb.weight  # (V, d) is both the table and the head's (out, in)
        self.position_ids = AllPositions()

    def units(self) -> list[Module]:
        """The chain forward runs: [GPTInput, *blocks, ln_f, head] (the GPT's own sub-modules)."""
        return [GPTInput(self.tok_emb, self.pos_emb, self.drop, self.position_ids), *self.blocks, self.ln_f,
                self.head]

    def check_tokens(self, tokens) -> None:
        """Raise TypeError/ValueError unless tokens is an integer array (B, T), ids in [0, vocab_size),
        1 <= T <= block_size."""
        check_tokens(tokens, self.vocab_size, "GPT tokens")
        if tokens.ndim != 2 or not 1 <= tokens.shape[1] <= self.block_size:
            raise ValueError("GPT tokens: expected shape (B, T) with 1 <= T <= block_size = "
                             f"{self.block_size}, got {tokens.shape}")

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """tokens: integer ids in [0, vocab_size), shape (B, T) with 1 <= T <= block_size;
        returns logits, shape (B, T, vocab_size) (a vocabulary-parallel head: this rank's ids only)."""
        self.check_tokens(tokens)
        x = tokens
        for unit in self.units():
            x = unit.forward(x)
        self.remember_output_shape(x.shape)
        return x

    def backward(self, dlogits: np.ndarray) -> None:
        """dlogits: upstream gradient, shape of forward's logits; adds every parameter's gradient.
        Returns None: the integer tokens have no gradient."""
        self.check_upstream(dlogits)
        backward_through(self.units(), dlogits)   # the runner's one loop

    def generate(self, tokens: np.ndarray, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, rng: np.random.Generator | None = None) -> np.ndarray:
        """Sample max_new_tokens more tokens after ``tokens`` (B, T0) int; returns (B, T0 + max_new_tokens).

        Each step looks at the last block_size tokens, divides the last position's logits by temperature,
        keeps the top_k largest (all if None), and draws from their softmax with ``rng`` (required).
        Dropout is off while sampling; the training mode is restored afterwards. Each step is a forward
        pass, so what the last forward kept for backward is replaced: sample between training steps.
        """
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"GPT.generate needs rng=numpy.random.Generator, got {type(rng).__name__}")
        check_tokens(tokens, self.vocab_size, "GPT.generate tokens")
        if tokens.ndim != 2 or tokens.shape[1] < 1:
            raise ValueError(f"GPT.generate tokens: expected shape (B, T0) with T0 >= 1, got {tokens.shape}")
        temperature = check_real(temperature, "GPT.generate temperature", 0.0, strict=True)
        max_new_tokens = check_count(max_new_tokens, "GPT.generate max_new_tokens", 0)
        if top_k is not None and check_count(top_k, "GPT.generate top_k") > self.vocab_size:
            raise ValueError(f"GPT.generate top_k must lie in [1, {self.vocab_size}], got {top_k}")
        was_training = self.training
        self.eval()
        try:
            out = tokens
            for _ in range(max_new_tokens):
                logits = self.forward(out[:, -self.block_size:])[:, -1, :].astype(np.float64) / temperature
                check_real_array(logits, "GPT.generate logits / temperature", finite=True)  # NaN weights?
                if top_k is not None:
                    kth = np.sort(logits, axis=-1)[:, -int(top_k)][:, None]
                    logits = np.where(logits < kth, -np.inf, logits)
                probs = softmax(logits, axis=-1)                               # (B, V)
                u = rng.random((probs.shape[0], 1))                            # inverse-CDF sampling
                nxt = np.minimum((probs.cumsum(axis=-1) < u).sum(axis=-1), self.vocab_size - 1)
                out = np.concatenate([out, nxt[:, None].astype(tokens.dtype)], axis=1)
        finally:
            self.train(was_training)
        return out

    def flops_per_token(self, t: int) -> dict[str, int]:
        """Training FLOPs per token at context length t: {"6N": 6 × the weights that multiply activations
        (the blocks' Linear weights and the head), "attention": 12·L·t·d, "total": their sum}."""
        n_matmul = sum(p.size for block in self.blocks
                       for p in (block.attn.qkv.weight, block.attn.proj.weight,
                                 block.mlp[0].weight, block.mlp[2].weight))
        n_matmul += self.head.weight.size
        counts = {"6N": 6 * n_matmul, "attention": 12 * self.n_layers * int(t) * self.d_model}
        counts["total"] = counts["6N"] + counts["attention"]
        return counts

    def __repr__(self) -> str:
        return (f"GPT(vocab_size={self.vocab_size}, block_size={self.block_size}, n_layers={self.n_layers}, "
                f"d_model={self.d_model}, n_heads={self.n_heads}, tie_weights={self.tie_weights})")

