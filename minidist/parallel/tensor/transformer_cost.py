"""Bytes sent and activation bytes kept per rank by a tensor-parallel transformer block, in closed form.

Notation: B batch, T sequence, d model width, h heads (d_k = d/h), f = d_ff; rank p of t holds h_p heads
(d_p = h_p·d_k channels) and f_p hidden units; b bytes per element; N = B·T tokens.

Activation memory after forward — what minidist's layers keep for backward, counted from the code (and
measured by minidist.sim.memory in the tests). With N' = N (tensor parallelism) or N/t (sequence parallelism):

    LayerNorm regions (2 of them)  2·(N'·d + N')·b                       x̂ and 1/σ per token
    attention                      (N·d + 5·N·d_p + B·h_p·T)·b + T²      input, q|k|v, O, O merged, lse;
                                                                         the causal mask, 1 byte per pair
                                   (4·N·d_p for a rank with one head: merging one head is a view, no copy)
    MLP                            (N·d + 3·N·f_p)·b                     input, GELU's x and Φ(x), its output

Korthikanti et al. count, for 16-bit activations with dropout and the T×T probabilities kept,
s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes with tensor parallelism and s·b·h/t·(34 + 5·a·s/h) with sequence
parallelism (s = T, b = B, h = d, a = heads): ``korthikanti_bytes``. minidist keeps no dropout masks
(dropout 0) and recomputes the probabilities from the log-sum-exp, so it has no T² float term; what
sequence parallelism divides by t is the same: the LayerNorm (and, in the paper, dropout) regions.
"""

from __future__ import annotations

from minidist.cluster import LinkModel
from minidist.sim.collective_cost import collective_seconds

from .comm import feature_slice


def block_activation_bytes(batch: int, seq_len: int, d_model: int, n_heads: int, d_ff: int, parts: int,
                           rank: int, itemsize: int, sequence_parallel: bool) -> dict[str, int]:
    """Activation bytes rank keeps after a split block's forward: layernorm, attention, mlp, total."""
    heads = feature_slice(n_heads, parts, rank)
    h_p = heads.stop - heads.start
    hidden = feature_slice(d_ff, parts, rank)
    d_p, f_p = h_p * (d_model // n_heads), hidden.stop - hidden.start
    n = batch * seq_len
    n_local = n // parts if sequence_parallel else n
    out = {"layernorm": 2 * (n_local * d_model + n_local) * itemsize,
           "attention": (n * d_model + (5 if h_p > 1 else 4) * n * d_p + batch * h_p * seq_len) * itemsize
           + seq_len * seq_len,
           "mlp": (n * d_model + 3 * n * f_p) * itemsize}
    out["total"] = sum(out.values())
    return out


def block_bytes_sent(batch: int, seq_len: int, d_model: int, parts: int, itemsize: int,
                     sequence_parallel: bool) -> int:
    """Bytes rank sends in one forward + backward of a block: 4 all-reduces (or all-gather + reduce-scatter
    pairs) of N·d words, 8(t−1)/t·N·d·b; sequence parallelism adds 2(t−1)/t·6d·b for the token-wise
    parameters' gradients (t dividing the counts: exact)."""
    words = 8 * (parts - 1) * batch * seq_len * d_model // parts
    if sequence_parallel:
        words += 2 * (parts - 1) * 6 * d_model // parts
    return words * itemsize


def block_comm_seconds(batch: int, seq_len: int, d_model: int, parts: int, itemsize: int,
                       link: LinkModel | None = None) -> float:
    """Simulated seconds of one block's communication (forward + backward) on the α-β link: 4 pairwise
    all-reduces of n = B·T·d words of b bytes, each 2(t−1)·(α + β·n·b/t) when t divides n, none hidden
    behind compute (the next layer needs the sum); sequence parallelism's token-wise gradients excluded."""
    return 4 * collective_seconds("pairwise", parts, batch * seq_len * d_model, itemsize, link or LinkModel())


def korthikanti_bytes(seq_len: int, batch: int, d_model: int, n_heads: int, parts: int,
                      sequence_parallel: bool) -> float:
    """The paper's activation bytes per layer (16-bit, dropout kept, probabilities stored)."""
    sbh = seq_len * batch * d_model
    attention = 5 * n_heads * seq_len / d_model
    if sequence_parallel:
        return sbh / parts * (34 + attention)
    return sbh * (10 + 24 / parts + attention / parts)
