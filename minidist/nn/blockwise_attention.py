"""Attention one key/value block at a time (FlashAttention's arithmetic): a block's partial result and its
backward from the final log-sum-exp, and ``BlockwiseAttention``, the attention core that keeps (O, lse)
instead of the (T × T) probabilities.

Attention of queries q against keys k and values v (per batch and head, d_k features, scale 1/√d_k):

    S = q·kᵀ/√d_k (masked pairs −∞),   P = softmax_rows(S),   O = P·v

One block of keys gives a *partial* result — its own softmax-weighted output and the log of its softmax
denominator, lse = log Σ_j exp(S_ij) over that block's keys (partial results merge by the online softmax:
minidist.parallel.context.ring.merge). Backward needs only the final lse and D = rowsum(dO ∘ O)
(FlashAttention-2, Dao), block by block:

    P = exp(S − lse),  dv = Pᵀ·dO,  dP = dO·vᵀ,  dS = P ∘ (dP − D),  dq = dS·k/√d_k,  dk = dSᵀ·q/√d_k

Cost of a block with n unmasked query–key pairs: forward 4·B·h·d_k·n FLOPs (q·kᵀ and P·v), backward
10·B·h·d_k·n (S recomputed, then dv, dP, dq, dk). Shapes: q (B, h, T_q, d_k), k and v (B, h, T_k, d_k),
lse (B, h, T_q); a mask (T_q, T_k) of booleans, True where a query may see a key.
"""

from __future__ import annotations

import numpy as np

from .module import Module, check_float_array


def causal_mask(q_positions: np.ndarray, k_positions: np.ndarray) -> np.ndarray:
    """(T_q, T_k) booleans: query at position i sees key at position j iff j ≤ i (global positions)."""
    return np.asarray(k_positions)[None, :] <= np.asarray(q_positions)[:, None]


def block_flops(q: np.ndarray, mask: np.ndarray | None, n_keys: int, backward: bool = False) -> int:
    """FLOPs of one block: (4 forward | 10 backward)·B·h·d_k·(unmasked pairs)."""
    batch, heads, t_q, d_k = q.shape
    pairs = t_q * n_keys if mask is None else int(np.count_nonzero(mask))
    return (10 if backward else 4) * batch * heads * d_k * pairs


def _scores(q, k, mask):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    return s


def block_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                    mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The partial result of one key block: (O (B, h, T_q, d_k), lse (B, h, T_q)).

    A query row that sees no key of this block (or a block of no keys) gets O = 0 and lse = −∞: it adds
    nothing when merged.
    """
    if k.shape[-2] == 0:
        return np.zeros_like(q), np.full(q.shape[:-1], -np.inf, dtype=q.dtype)
    s = _scores(q, k, mask)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isneginf(m), 0.0, m)            # a fully masked row: exp(−∞) = 0 everywhere
    p = np.exp(s - m_safe)
    total = p.sum(axis=-1, keepdims=True)
    seen = total > 0
    out = (p @ v) / np.where(seen, total, 1.0)
    lse = np.where(seen, m_safe + np.log(np.where(seen, total, 1.0)), -np.inf)
    return out, lse[..., 0]


def block_attention_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                             lse: np.ndarray, d_out: np.ndarray,
                             delta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One key block's share of the gradients: (dq (B, h, T_q, d_k), dk, dv (B, h, T_k, d_k)).

    lse: the FINAL log-sum-exp of each query row over all keys (B, h, T_q); d_out: dL/dO (B, h, T_q, d_k);
    delta: rowsum(d_out ∘ O) with the final O, (B, h, T_q). dq summed over all blocks is the full dq;
    dk and dv summed over all query blocks are the full dk and dv.
    """
    scale = 1.0 / np.sqrt(q.shape[-1])
    lse_safe = np.where(np.isneginf(lse), 0.0, lse)
    p = np.exp(_scores(q, k, mask) - lse_safe[..., None])   # masked pairs: exp(−∞) = 0
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    ds = p * (dp - delta[..., None])
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv


class BlockwiseAttention(Module):
    """An attention core: softmax(q·kᵀ/√d_k + mask)·v over all keys as one block, keeping (q, k, v, O, lse)
    for backward and recomputing P there (no (T × T) float array is kept). Split attentions use it as their
    ``core``; ring attention (minidist.parallel.context.RingAttention) is the same interface over a ring.

    forward(q, k, v), each (B, h, T, d_k) -> O (B, h, T, d_k); backward(dO) -> (dq, dk, dv).
    """

    def __init__(self, causal: bool = True):
        self.causal = bool(causal)
        self._saved: tuple | None = None

    def forward(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        check_float_array(q, "BlockwiseAttention q", ndim=4)
        mask = np.tri(q.shape[2], dtype=bool) if self.causal else None
        out, lse = block_attention(q, k, v, mask)
        self._saved = (q, k, v, mask, out, lse)
        return out

    def backward(self, d_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._saved is None:
            raise RuntimeError("BlockwiseAttention.backward called before forward")
        q, k, v, mask, out, lse = self._saved
        return block_attention_backward(q, k, v, mask, lse, d_out, (d_out * out).sum(axis=-1))

    def __repr__(self) -> str:
        return f"BlockwiseAttention(causal={self.causal})"
