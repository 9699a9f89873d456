"""What the planner knows of a model: a GPT (optionally with mixture-of-experts MLPs), in closed form.

Notation (as lesson 16/17): L layers, d = d_model, a heads, f = d_ff (4d by default), V vocabulary,
T sequence, E experts (0: dense) with top-k routing.

    per block      attention 4d² + 4d (qkv and proj with biases), 2 LayerNorms 4d,
                   MLP 2df + f + d  (an MoE: E of them, plus the router d·E)
    outside        token embedding V·d, positions T·d, final LayerNorm 2d, head V·d (no bias)
    FLOPs/token    6·N_active + 12·L·T·d (Kaplan et al.; lesson 16): N_active = the weights a token multiplies
                   (k experts' MLPs of E), training = forward + 2 × forward
    activations    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
                   bytes per layer and micro-batch of b sequences at 16 bits, s = T/c tokens per rank,
                   tensor and sequence parallel over t:  s·b·d·(34/t + 5·a·s/(d·t)) with attention "eager"
                   (the scores, softmax and its dropout mask kept); FlashAttention ("flash", the default)
                   keeps only its output (among the 34) and the FP32 log-sum-exp, 4·a·s·b/t, never the s²
                   scores; selective recomputation drops the 5·a·s/d term (the same as flash), full
                   recomputation keeps only the layer's input, 2·s·b·d/t; without sequence parallelism
                   s·b·d·(10 + 24/t + 5·a·s/(d·t)) and 2·s·b·d (the same paper, Table 2)
"""

from __future__ import annotations

from dataclasses import dataclass

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("flash", "eager")


def check_int(name: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class ModelSpec:
    """A GPT to plan for: layers, d_model, heads, seq (tokens per sequence), batch (sequences per step,
    global), vocab, d_ff (default 4·d_model), experts (0: dense MLPs), top_k (experts per token)."""

    layers: int
    d_model: int
    heads: int
    seq: int
    batch: int
    vocab: int = 32000
    d_ff: int | None = None
    experts: int = 0
    top_k: int = 1

    def __post_init__(self):
        for name in ("layers", "d_model", "heads", "seq", "batch", "vocab"):
            check_int(name, getattr(self, name))
        check_int("d_ff", self.ff)
        check_int("experts", self.experts, 0)
        check_int("top_k", self.top_k)
        if self.d_model % self.heads:
            raise ValueError(f"d_model = {self.d_model} must be a multiple of heads = {self.heads}")
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"top_k = {self.top_k} cannot exceed experts = {self.experts}")

    @property
    def ff(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def attention_params(self) -> int:
        """Per block: attention (4d² + 4d) and the two LayerNorms (4d)."""
        d = self.d_model
        return 4 * d * d + 8 * d

    def mlp_params(self) -> int:
        """One MLP (one expert): 2·d·f + f + d."""
        return 2 * self.d_model * self.ff + self.ff + self.d_model

    def expert_params(self) -> int:
        """Per block, the experts' MLPs (E of them; 0 for a dense model)."""
        return self.experts * self.mlp_params()

    def dense_block_params(self) -> int:
        """Per block, everything but the experts: attention, norms, the dense MLP or the router."""
        return self.attention_params() + (self.d_model * self.experts if self.moe else self.mlp_params())

    def outside_params(self) -> tuple[int, int]:
        """(first stage: token and position embeddings, last stage: final LayerNorm and head)."""
        d = self.d_model
        return self.vocab * d + self.seq * d, 2 * d + self.vocab * d

    def total_params(self) -> int:
        first, last = self.outside_params()
        return self.layers * (self.dense_block_params() + self.expert_params()) + first + last

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6·N_active + 12·L·T·d."""
        d, experts_used = self.d_model, (self.top_k if self.moe else 1)
        active = self.layers * (4 * d * d + experts_used * 2 * d * self.ff) + self.vocab * d
        return 6 * active + 12 * self.layers * self.seq * self.d_model

    def activation_bytes(self, micro_batch: int, tensor: int, context: int, recompute: str,
                         attention: str = "flash", sequence_parallel: bool = True) -> float:
        """Korthikanti's bytes per layer per micro-batch at 16 bits (tensor + sequence parallel over t,
        the sequence split over c), the s² term only for eager attention (flash: its log-sum-exp); an MoE
        layer's MLP part (19·s·b·d of the 34) counts k times. Without sequence parallelism the whole-width
        part (the LayerNorms' inputs 4, the qkv and fc1 inputs 2 + 2, the two dropout masks 1 + 1: 10 of
        the 34) is held whole on every tensor rank (Korthikanti's 10 + 24/t), and so is a recomputed
        layer's input."""
        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
        if attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
        s, b, d, a, t = self.seq / context, micro_batch, self.d_model, self.heads, tensor
        if recompute == "full":
            return 2 * s * b * d / (t if sequence_parallel else 1)
        k = self.top_k if self.moe else 1
        per_token, whole = 15 + 19 * k, (0 if sequence_parallel else 7 + 3 * k)
        split = s * b * d * whole + s * b * d * (per_token - whole) / t
        if attention == "flash":
            return split + 4 * a * s * b / t
        scores = 0.0 if recompute == "selective" else 5 * a * s / d
        return split + s * b * d * scores / t
