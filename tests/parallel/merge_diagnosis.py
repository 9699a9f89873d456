"""Diagnosing the online-softmax merge in its own terms: for which row (which two blocks' lse) the merged
log-sum-exp is off — the max of the two blocks or the sum of their rescaled totals — or which block's
weight exp(lseᵢ − lse) scales its partial O wrongly, and a row that saw no key turning into NaN.

The merge, written out here: m = max(lse₁, lse₂), S = e^(lse₁−m) + e^(lse₂−m), lse = m + log S, and
O = w₁·O₁ + w₂·O₂ with wᵢ = e^(lseᵢ−lse) (w₁ + w₂ = 1); a side with lseᵢ = −∞ has wᵢ = 0, and a row with
both −∞ stays (O, lse) = (0, −∞). With O₁ = e₀ and O₂ = e₁ (unit rows) the merged O reads (w₁, w₂) off.
"""

import math

import numpy as np

from tests.nn.backward_diagnosis import first_off

INF = math.inf
#: (lse₁, lse₂) per query row: equal, either side larger, too large for a naive exp, one or both empty
ROWS = ((0.0, 0.0), (1.0, -2.0), (-3.0, 0.5), (800.0, 799.0), (-INF, 1.5), (2.0, -INF), (-INF, -INF))


def merged(lse1: float, lse2: float) -> tuple[float, float, float, float]:
    """(m, S, lse, w₁) of one row; w₂ = 1 − w₁ unless the row saw no key (then both are 0)."""
    m = max(lse1, lse2)
    if m == -INF:
        return m, 0.0, -INF, 0.0
    total = math.exp(lse1 - m) + math.exp(lse2 - m)
    lse = m + math.log(total)
    return m, total, lse, math.exp(lse1 - lse)


def diagnose_merge(merge) -> str | None:
    """The first row where merge((e₀ rows, lse₁), (e₁ rows, lse₂)) breaks the online softmax, then a row
    of random partial O (d_k = 3, two leading axes)."""
    lse1, lse2 = (np.array([[row[i] for row in ROWS]]) for i in (0, 1))          # (1, T_q)
    out1, out2 = np.zeros((1, len(ROWS), 2)), np.zeros((1, len(ROWS), 2))
    out1[..., 0], out2[..., 1] = 1.0, 1.0
    what = f"merge(O₁ = e₀ rows, lse₁; O₂ = e₁ rows, lse₂) of shapes {out1.shape}, {lse1.shape}"
    with np.errstate(all="ignore"):
        out, lse = (np.asarray(a) for a in merge(out1, lse1.copy(), out2, lse2.copy()))
    if out.shape != out1.shape or lse.shape != lse1.shape:
        return f"{what}: returns O of shape {out.shape} and lse of shape {lse.shape}; expected the inputs'"
    for i, (a, b) in enumerate(ROWS):
        m, total, want_lse, w1 = merged(a, b)
        w2 = 0.0 if want_lse == -INF else 1.0 - w1
        row = f"{what}: row {i} (block 1's lse₁ = {a}, block 2's lse₂ = {b})"
        if np.isnan(out[0, i]).any() or np.isnan(lse[0, i]):
            return f"{row}: NaN in (O, lse) = ({out[0, i]}, {lse[0, i]}); expected ([{w1}, {w2}], {want_lse})"
        if not np.isclose(lse[0, i], want_lse, rtol=1e-12, atol=1e-12):
            return (f"{row}: the merged lse should be m + log S = {want_lse:.12g} with the max of the two "
                    f"blocks m = max(lse₁, lse₂) = {m} and the sum S = e^(lse₁−m) + e^(lse₂−m) = "
                    f"{total:.12g}; it is {lse[0, i]:.12g}")
        for block, want, got in ((1, w1, out[0, i, 0]), (2, w2, out[0, i, 1])):
            if not np.isclose(got, want, rtol=1e-12, atol=1e-12):
                added = out[0, i].sum()
                sum_off = "" if np.isclose(added, w1 + w2) else \
                    f" (the two weights add to {added:.12g}; they must add to {w1 + w2:g})"
                return (f"{row}: block {block}'s O is scaled by {got:.12g}; its weight should be "
                        f"e^(lse{'₁₂'[block - 1]} − lse) = {want:.12g} with the merged lse = {want_lse:.12g}"
                        f"{sum_off}")
    rng = np.random.default_rng(0)
    o1, o2 = rng.standard_normal((2, 2, 4, 3))
    l1, l2 = rng.standard_normal((2, 2, 4))
    total = np.logaddexp(l1, l2)
    want = np.exp(l1 - total)[..., None] * o1 + np.exp(l2 - total)[..., None] * o2
    wrong = first_off("O", merge(o1.copy(), l1.copy(), o2.copy(), l2.copy())[0], want, rtol=1e-12)
    if wrong:
        return (f"merge of random partials, O (2, 4, 3) and lse (2, 4): {wrong} — O = w₁·O₁ + w₂·O₂ row by "
                f"row, the weights (2, 4) broadcast along d_k")
    return None
