"""What the planner knows of a GPU: its data sheet, what was measured on it, and published kernel speeds.

The roofline's two roofs are the *achieved* ones, not the data sheet's (roofline_ops.py prices every
operation on them):

    H100 SXM 80GB HBM3   data sheet 989 TFLOP/s dense BF16, 3.35 TB/s HBM3, 132 SMs. Measured on one
                         (minidist issue 44, 2026-11-27, PyTorch 2.11): a BF16 8192³ matmul 791 TFLOP/s, a
                         device-to-device copy 3.00 TB/s (bytes read + written)
    A100 SXM 80GB        data sheet 312 TFLOP/s dense BF16, 2.04 TB/s HBM2e, 108 SMs. Not measured here:
                         the H100's measured fractions are assumed (matmul 791/989 = 80% of peak, copy
                         3.00/3.35 = 90% of bandwidth)
    V100 SXM2 32GB       data sheet 125 TFLOP/s FP16 tensor cores, 0.9 TB/s HBM2, 80 SMs; fractions as A100

Attention runs as one fused kernel (FlashAttention-2: what PyTorch's scaled_dot_product_attention picks
for BF16 on these GPUs) at the speed its authors measured, FLOPs counted as they count them (forward
4·b·h·T²·d_head, halved under the causal mask; backward 2.5 × forward):

    H100   Shah et al. 2024, "FlashAttention-3: Fast and Accurate Attention with Asynchrony and
           Low-precision", Figures 5-6 (H100 80GB SXM5, BF16, head dim 64, FlashAttention-2's bars), TFLOP/s
           at T = 512 ... 16k: forward causal 180 229 262 284 295 299, forward 282 306 318 321 322 324,
           backward 198 238 264 279 287 291 (the causal backward is not plotted: we scale the backward by
           the forward's causal/non-causal ratio at the same T); log-linear in T between the bars
    A100   Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
           abstract: "50-73% of the theoretical maximum FLOPs/s on A100": the lower end, 50%, at every T
    V100   FlashAttention-2 does not run on Volta; the A100's 50% is assumed
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TERA = 1e12
SEQS = (512, 1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True)
class GPU:
    """A device's data sheet (peak FLOP/s, bandwidth bytes/s), what it achieves (matmul FLOP/s on a large
    square BF16 matmul, copy bytes/s), its SM count, and FlashAttention-2's measured speeds (FLOP/s at
    the sequence lengths SEQS: causal forward, forward, backward; None: ``attention_fraction`` of peak)."""

    name: str
    peak: float
    bandwidth: float
    matmul: float
    copy: float
    sms: int
    attention_causal: tuple | None = None
    attention_forward: tuple | None = None
    attention_backward: tuple | None = None
    attention_fraction: float = 0.5

    def attention_rate(self, seq: int, backward: bool, causal: bool = True) -> float:
        """FlashAttention-2's FLOP/s at sequence length seq (forward or backward)."""
        if self.attention_causal is None:
            return self.attention_fraction * self.peak
        causal_share = interpolate(seq, self.attention_causal) / interpolate(seq, self.attention_forward)
        if backward:
            rate = interpolate(seq, self.attention_backward) * (causal_share if causal else 1.0)
        else:
            rate = interpolate(seq, self.attention_causal if causal else self.attention_forward)
        return rate * TERA


def interpolate(seq: int, table: tuple) -> float:
    """table's value at seq, log-linear between the points SEQS, flat beyond them."""
    x = min(max(math.log2(seq), math.log2(SEQS[0])), math.log2(SEQS[-1]))
    i = min(int(x - math.log2(SEQS[0])), len(SEQS) - 2)
    frac = x - math.log2(SEQS[i])
    return table[i] + (table[i + 1] - table[i]) * frac


H100_MEASURED_MATMUL, H100_MEASURED_COPY = 791 * TERA, 3.00e12       # issue 44, one H100 80GB HBM3
MATMUL_FRACTION, COPY_FRACTION = H100_MEASURED_MATMUL / (989 * TERA), H100_MEASURED_COPY / 3.35e12

GPUS = {
    "h100": GPU("H100 SXM 80GB", 989 * TERA, 3.35e12, H100_MEASURED_MATMUL, H100_MEASURED_COPY, 132,
                attention_causal=(180, 229, 262, 284, 295, 299),
                attention_forward=(282, 306, 318, 321, 322, 324),
                attention_backward=(198, 238, 264, 279, 287, 291)),
    "a100": GPU("A100 SXM 80GB", 312 * TERA, 2.039e12, MATMUL_FRACTION * 312 * TERA,
                COPY_FRACTION * 2.039e12, 108),
    "v100": GPU("V100 SXM2 32GB", 125 * TERA, 0.9e12, MATMUL_FRACTION * 125 * TERA,
                COPY_FRACTION * 0.9e12, 80),
}
