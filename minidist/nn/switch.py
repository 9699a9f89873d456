"""A small Switch Transformer: the GPT of gpt.py with every block's MLP replaced by a mixture of experts.

    x0 = tok_emb(tokens) + pos_emb(0 … T−1);   x_l = block_l(x_{l−1}), mlp = MoE ("Switch layer",
    Fedus et al.);   logits = head(ln_f(x_L))
The training loss is cross-entropy + Σ_l (α·aux_l + β·z_l): ``router_loss`` after forward; each MoE's
backward already adds its share of the gradient, so GPT's forward and backward serve unchanged.

Parameters: GPT's dense ones plus L·E expert MLPs, while the FLOPs per token are those of k experts: the
point of the design ("more parameters at constant compute").
"""

from __future__ import annotations

import numpy as np

from minidist.nn.checks import check_count

from .gpt import GPT
from .module import resolve_rng
from .moe import MoE


class SwitchTransformer(GPT):
    """tokens (B, T) int -> logits (B, T, V); GPT's sub-modules, each ``blocks[l].mlp`` an MoE."""

    def __init__(self, vocab_size: int, block_size: int, n_layers: int, d_model: int, n_heads: int,
                 num_experts: int, d_ff: int | None = None, k: int = 1, capacity_factor: float = 1.25,
                 aux_loss_coef: float = 0.01, z_loss_coef: float = 0.0, groups: int = 1, *,
                 rng: np.random.Generator | None = None, dtype=np.float32):
        rng = resolve_rng(rng)
        super().__init__(vocab_size, block_size, n_layers, d_model, n_heads, rng=rng, dtype=dtype)
        d_ff = 4 * int(d_model) if d_ff is None else check_count(d_ff, "SwitchTransformer d_ff")
        for block in self.blocks:
            block.mlp = MoE(d_model, d_ff, num_experts, k, capacity_factor, aux_loss_coef, z_loss_coef,
                            groups, rng=rng, dtype=dtype)  # the Switch layer in place of the dense MLP
            block.d_ff = d_ff

    @property
    def router_loss(self) -> float:
        """Σ over the MoE layers of aux_loss_coef · aux + z_loss_coef · z, from the last forward."""
        return float(sum(block.mlp.loss for block in self.blocks))

    def flops_per_token(self, t: int) -> dict[str, int]:
        """Training FLOPs per token at context length t, as GPT's, with the weights a token meets: per block
        attention, the router and k experts (not all E) — {"6N", "attention", "total"}."""
        n_active = self.head.weight.size
        for block in self.blocks:
            moe = block.mlp
            n_active += block.attn.qkv.weight.size + block.attn.proj.weight.size
            n_active += moe.d_model * moe.num_experts + moe.k * 2 * moe.d_model * moe.d_ff
        counts = {"6N": 6 * n_active, "attention": 12 * self.n_layers * int(t) * self.d_model}
        counts["total"] = counts["6N"] + counts["attention"]
        return counts

    def __repr__(self) -> str:
        moe = self.blocks[0].mlp
        return (f"SwitchTransformer(layers={self.n_layers}, d_model={self.d_model}, "
                f"experts={moe.num_experts}, k={moe.k})")
