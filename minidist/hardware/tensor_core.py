"""A tensor-core tile: D = A·B + C on 4 × 4 matrices, FP16 inputs, FP32 (or FP16) accumulation.

"Hardware Accelerators for Training DNNs" (Volta V100 slide): 80 SMs, 640 Tensor Cores; each Volta tensor
core does one 4 × 4 × 4 matrix multiply-accumulate per clock — 64 fused multiply-adds — with FP16 A and
B and an FP32 (or FP16) accumulator C. The mixed-precision slides' advice follows from it: FP16 products
are exact in FP32 (11 + 11 significant bits ≤ 24), so FP32 accumulation loses only the additions' rounding,
while an FP16 accumulator rounds every partial sum to 11 bits and its error grows with K.

    mma:     D ← round_acc(…round_acc(round_acc(C + A[:, 0]·B[0, :]) + A[:, 1]·B[1, :]) … + A[:, 3]·B[3, :])
    matmul:  A (M × K) @ B (K × N) as ⌈M/4⌉·⌈N/4⌉ output tiles, each running ⌈K/4⌉ MMAs in order of K

Each addition is formed in float64 and rounded once with ``minidist.precision.quantize`` (exact, as
``minidist.precision.gemm`` argues). Vectorised over all tiles; the loop runs over the K/4 steps.
(The order inside real hardware's 4-term sum is not public; this models it as sequential.)
"""

from __future__ import annotations

import numpy as np

from minidist.nn.checks import check_real_array
from minidist.precision import FP16, FP32, FloatFormat, quantize

TILE = 4


def mma(a: np.ndarray, b: np.ndarray, c: np.ndarray, accum: FloatFormat = FP32) -> np.ndarray:
    """One tensor-core step on a batch of tiles: a (..., 4, 4), b (..., 4, 4), c (..., 4, 4) → d (..., 4, 4)
    = a·b + c with a, b rounded to FP16 and each of the four additions rounded into ``accum``."""
    for name, x in (("a", a), ("b", b), ("c", c)):
        if not isinstance(x, np.ndarray) or x.shape[-2:] != (TILE, TILE):
            raise ValueError(f"mma: {name} must be an array of 4 × 4 tiles (..., 4, 4), got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        check_real_array(x, f"mma {name}")
    a, b = quantize(a.astype(np.float64), FP16), quantize(b.astype(np.float64), FP16)
    d = quantize(c.astype(np.float64), accum)
    for k in range(TILE):
        d = quantize(d + a[..., :, k, None] * b[..., None, k, :], accum)     # the product is exact
    return d


def tensor_core_matmul(a: np.ndarray, b: np.ndarray, accum: FloatFormat = FP32) -> np.ndarray:
    """a (M × K) @ b (K × N) in 4 × 4 × 4 MMAs (zero-padded to multiples of 4); float64 values of accum."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.ndim == b.ndim == 2):
        raise TypeError("tensor_core_matmul expects 2-D numpy arrays a (M, K) and b (K, N)")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"tensor_core_matmul: inner dimensions differ, a {a.shape} and b {b.shape}")
    check_real_array(a, "tensor_core_matmul a"), check_real_array(b, "tensor_core_matmul b")
    (m, k), n = a.shape, b.shape[1]
    mt, kt, nt = -(-m // TILE), -(-k // TILE), -(-n // TILE)
    ap = np.zeros((mt * TILE, kt * TILE))
    bp = np.zeros((kt * TILE, nt * TILE))
    ap[:m, :k], bp[:k, :n] = a, b
    a_tiles = ap.reshape(mt, TILE, kt, TILE).transpose(0, 2, 1, 3)[:, None]     # (mt, 1, kt, 4, 4)
    b_tiles = bp.reshape(kt, TILE, nt, TILE).transpose(2, 0, 1, 3)[None]       # (1, nt, kt, 4, 4)
    d = np.zeros((mt, nt, TILE, TILE))
    for step in range(kt):
        d = mma(a_tiles[:, :, step], b_tiles[:, :, step], d, accum)
    return d.transpose(0, 2, 1, 3).reshape(mt * TILE, nt * TILE)[:m, :n]
