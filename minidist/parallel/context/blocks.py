"""The online-softmax merge of two partial attention results over disjoint key sets (ring attention's step).

One key block gives a *partial* result (O, lse) (minidist.nn.blockwise_attention.block_attention). Two
partial results (O₁, lse₁) and (O₂, lse₂) over disjoint key sets merge into the result over their union
exactly (the online softmax of Milakov & Gimelshein, "Online normalizer calculation for softmax"; used by
FlashAttention and by ring attention, Liu et al., "Ring Attention with Blockwise Transformers"):

    lse = log(exp(lse₁) + exp(lse₂)),     O = exp(lse₁ − lse)·O₁ + exp(lse₂ − lse)·O₂
"""

from __future__ import annotations

import numpy as np


def merge(out1: np.ndarray, lse1: np.ndarray, out2: np.ndarray,
          lse2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge two partial results over disjoint key sets into the result over their union.

    out1, out2: (..., T_q, d_k); lse1, lse2: (..., T_q). Returns (out, lse) of the same shapes. Rows that
    saw no key on either side stay (0, −∞).
    """
    # BEGIN SOLUTION online_softmax_merge
    lse = np.logaddexp(lse1, lse2)
    safe = np.where(np.isneginf(lse), 0.0, lse)          # both sides empty: weights exp(−∞) = 0
    out = np.exp(lse1 - safe)[..., None] * out1 + np.exp(lse2 - safe)[..., None] * out2
    return out, lse
    # END SOLUTION
