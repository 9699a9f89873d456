"""A small Switch Transformer: a GPT-style decoder whose blocks' MLP is a mixture of experts.

    h = tok_emb(tokens) + pos_emb(0..T−1)                    (B, T, d)
    h = block_l(h),  l = 1..L     pre-LayerNorm blocks, mlp = MoE (Fedus et al.: "Switch layer")
    logits = head(ln_f(h))                                   (B, T, V)
The training loss is cross-entropy + Σ_l (α·aux_l + β·z_l): ``router_loss`` after forward; each MoE's
backward already adds its share of the gradient.

Parameters: the dense ones of a GPT (V·d + T·d + L·(4d² + …) + d·V) plus L·E expert MLPs, while the
FLOPs per token are those of k experts: the point of the design ("more parameters at constant compute").
"""

from __future__ import annotations

import numpy as np

from .block import TransformerBlock
from .embedding import Embedding
from .linear import Linear
from .module import Module, resolve_rng
from .moe import MoE
from .norm import LayerNorm


class SwitchTransformer(Module):
    """tokens (B, T) int -> logits (B, T, V); sub-modules ``tok_emb``, ``pos_emb``, ``blocks`` (each a
    TransformerBlock whose ``mlp`` is an MoE), ``ln_f``, ``head`` (Linear d → V, no bias)."""

    def __init__(self, vocab_size: int, block_size: int, n_layers: int, d_model: int, n_heads: int,
                 num_experts: int, d_ff: int | None = None, k: int = 1, capacity_factor: float = 1.25,
                 aux_loss_coef: float = 0.01, z_loss_coef: float = 0.0, groups: int = 1, *,
                 rng: np.random.Generator | None = None, dtype=np.float32):
        if int(n_layers) < 1 or int(block_size) < 1:
            raise ValueError(f"SwitchTransformer needs n_layers, block_size >= 1, got {n_layers}, {block_size}")
        rng = resolve_rng(rng)
        d_ff = 4 * int(d_model) if d_ff is None else int(d_ff)
        self.block_size = int(block_size)
        self.tok_emb = Embedding(vocab_size, d_model, rng=rng, dtype=dtype)
        self.pos_emb = Embedding(block_size, d_model, rng=rng, dtype=dtype)
        self.blocks = []
        for _ in range(int(n_layers)):
            block = TransformerBlock(d_model, n_heads, d_ff, rng=rng, dtype=dtype)
            block.mlp = MoE(d_model, d_ff, num_experts, k, capacity_factor, aux_loss_coef, z_loss_coef, groups,
                            rng=rng, dtype=dtype)  # the Switch layer in place of the dense MLP
            self.blocks.append(block)
        self.ln_f = LayerNorm(d_model, dtype=dtype)
        self.head = Linear(d_model, vocab_size, bias=False, rng=rng, dtype=dtype)

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """tokens: integer ids, shape (B, T) with T <= block_size; returns logits (B, T, V)."""
        if not isinstance(tokens, np.ndarray) or tokens.ndim != 2 or tokens.shape[1] > self.block_size:
            raise ValueError(f"SwitchTransformer expects tokens of shape (B, T <= {self.block_size}), got "
                             f"{getattr(tokens, 'shape', type(tokens).__name__)}")
        h = self.tok_emb.forward(tokens) + self.pos_emb.forward(np.arange(tokens.shape[1]))
        for block in self.blocks:
            h = block.forward(h)
        logits = self.head.forward(self.ln_f.forward(h))
        self.remember_output_shape(logits.shape)
        return logits

    def backward(self, dlogits: np.ndarray) -> None:
        """dlogits: (B, T, V); adds every parameter's gradient (the router losses' included). Returns None:
        tokens have no gradient."""
        self.check_upstream(dlogits)
        dh = self.ln_f.backward(self.head.backward(dlogits))
        for block in reversed(self.blocks):
            dh = block.backward(dh)
        self.pos_emb.backward(dh.sum(axis=0))
        self.tok_emb.backward(dh)

    @property
    def router_loss(self) -> float:
        """Σ over the MoE layers of aux_loss_coef · aux + z_loss_coef · z, from the last forward."""
        return float(sum(block.mlp.loss for block in self.blocks))

    def __repr__(self) -> str:
        moe = self.blocks[0].mlp
        return (f"SwitchTransformer(layers={len(self.blocks)}, d_model={moe.d_model}, experts={moe.num_experts}, "
                f"k={moe.k})")
