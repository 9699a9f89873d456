"""Low-precision matrix multiplication: operands in one format, accumulation in another, one rounding per
addition — and Wang et al.'s (2018) chunk-based accumulation.

Shapes: a (M, K), b (K, N) → c (M, N), c[i, j] = Σ_k a[i, k]·b[k, j] computed as

    sequential:   acc ← round(acc + a[i,k]·b[k,j])                  for k = 0 … K−1
    chunked (CL): partial ← round(partial + a[i,k]·b[k,j])          within each chunk of CL products
                  acc ← round(acc + partial)                          after each chunk

where round() rounds into ``accum_fmt`` (nearest-even or stochastic). The "Hardware
Accelerators for Training Deep Neural Networks" slides ("8-Bit Floating-Point Training": FP8 (1,5,2)
multiplications, 16-bit additions, chunk size 64) explains why chunking helps: in a long sequential sum the
accumulator grows
until each new product is below half its ulp and is lost ("swamping"); a chunk's partial sum stays small,
so its products survive, and only K/CL additions meet the large accumulator.

Exactness: operands are rounded to ``operand_fmt`` (RNE); a product of two of them has at most
2·(m+1) significant bits, so the product is exact in float64, and we require it to be exact in the
accumulator's precision too (2·(m_op+1) <= m_acc+1: E5M2 or E4M3 into FP16, (1,6,9), FP32 — not FP16·FP16
into FP16). The sum acc + product is formed in float64: it is exact unless one addend is below 2^−52 of
the other, and then both the exact and the float64 sum round to the larger addend (a value of the
accumulator format) — so every addition is rounded exactly once, as hardware would.

Vectorised over the M·N output elements; the Python loop runs over k.
"""

from __future__ import annotations

import numpy as np

from minidist.nn.module import check_float_array

from .formats import FP8_E5M2, FP16, FloatFormat, check_format
from .rounding import ROUNDINGS, quantize


def lowp_matmul(a: np.ndarray, b: np.ndarray, operand_fmt: FloatFormat = FP8_E5M2,
                accum_fmt: FloatFormat = FP16, chunk: int | None = 64, rounding: str = "nearest",
                rng: np.random.Generator | None = None) -> np.ndarray:
    """c = a @ b with operands rounded to operand_fmt and every addition rounded into accum_fmt.

    chunk=CL (default 64, Wang et al. 2018) sums chunks of CL products first, each chunk's sum then added
    into the total in accum_fmt too (as Wang et al.); chunk=None accumulates sequentially.
    rounding applies to the accumulator ("stochastic" needs rng). Returns float64 values of accum_fmt
    (Inf/NaN where the accumulator overflows).
    """
    check_float_array(a, "lowp_matmul a", ndim=2)
    check_float_array(b, "lowp_matmul b", ndim=2)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"lowp_matmul: inner dimensions differ, a {a.shape} and b {b.shape}")
    _check_options(operand_fmt, accum_fmt, chunk, rounding, rng)
    a = quantize(a.astype(np.float64), operand_fmt)
    b = quantize(b.astype(np.float64), operand_fmt)
    return _accumulate(lambda k: np.outer(a[:, k], b[k, :]), a.shape[1], (a.shape[0], b.shape[1]),
                       accum_fmt, chunk, rounding, rng)


def lowp_dot(x: np.ndarray, y: np.ndarray, operand_fmt: FloatFormat = FP8_E5M2, accum_fmt: FloatFormat = FP16,
             chunk: int | None = 64, rounding: str = "nearest",
             rng: np.random.Generator | None = None) -> np.ndarray:
    """T dot products at once: x, y (T, K) → c (T,), c[t] = Σ_k x[t, k]·y[t, k], as lowp_matmul sums."""
    check_float_array(x, "lowp_dot x", ndim=2)
    if not isinstance(y, np.ndarray) or x.shape != y.shape:
        raise ValueError(
            f"lowp_dot: x {x.shape} and y {getattr(y, 'shape', None)} must have one shape (T, K)"
        )
    check_float_array(y, "lowp_dot y", ndim=2)
    _check_options(operand_fmt, accum_fmt, chunk, rounding, rng)
    x = quantize(x.astype(np.float64), operand_fmt)
    y = quantize(y.astype(np.float64), operand_fmt)
    return _accumulate(
        lambda k: x[:, k] * y[:, k], x.shape[1], (x.shape[0],), accum_fmt, chunk, rounding, rng
    )


def _accumulate(product, k_total: int, shape: tuple[int, ...], accum_fmt: FloatFormat, chunk: int | None,
                rounding: str, rng: np.random.Generator | None) -> np.ndarray:
    """Σ_k product(k) with one rounding into accum_fmt per addition, sequential or in chunks."""

    def add(acc: np.ndarray, term: np.ndarray) -> np.ndarray:
        return quantize(acc + term, accum_fmt, rounding=rounding, rng=rng)   # acc + term: exact, see above

    acc = np.zeros(shape)
    partial = np.zeros(shape)
    for k in range(k_total):
        if chunk is None:
            acc = add(acc, product(k))
            continue
        partial = add(partial, product(k))
        if (k + 1) % chunk == 0 or k + 1 == k_total:   # end of a chunk: one addition into the total
            acc = add(acc, partial)
            partial[...] = 0
    return acc


def _check_options(operand_fmt, accum_fmt, chunk, rounding, rng) -> None:
    check_format(operand_fmt)
    check_format(accum_fmt)
    if 2 * (operand_fmt.man_bits + 1) > accum_fmt.man_bits + 1:
        raise ValueError(f"products of {operand_fmt.name} have {2 * (operand_fmt.man_bits + 1)} significant "
                         f"bits; {accum_fmt.name} holds {accum_fmt.man_bits + 1}: choose a wider accumulator")
    if chunk is not None and (
        isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1
    ):
        raise ValueError(f"chunk must be None or an int >= 1, got {chunk!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if rounding == "stochastic" and rng is None:
        raise ValueError("stochastic accumulation needs rng=np.random.default_rng(seed)")
