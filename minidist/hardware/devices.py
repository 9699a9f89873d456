"""The seeds' accelerators as rooflines (``hardware.roofline.Machine``), each peak derived from its parts.

From "Hardware Accelerators for Training DNNs" and Catanzaro's "Scaling Deep Learning" slides:

    TPU v1   65,536 (256 × 256) 8-bit MACs · 2 · 700 MHz = 91.75 T int8 ops/s ("92T");
             two 2133 MHz DDR3 channels (64-bit each: 8 B per transfer) = 34.1 GB/s
    GP100    10 TFLOPS FP32; 67 GFLOPS/W FP16 at 300 W TDP = 20.1 TFLOPS FP16 (twice FP32); 750 GB/s HBM
    V100     80 SMs, 5120 CUDA cores, 640 Tensor Cores, 900 GB/s HBM2; at the datasheet's 1530 MHz boost
             clock (not on the slides) 5120 · 2 · 1.53 G = 15.7 TFLOPS FP32 and 640 · 64 FMA · 2 · 1.53 G
             = 125 TFLOPS on the tensor cores (one 4 × 4 × 4 MMA per core per clock)
    TPU v2   45 TFLOPS per chip, 600 GB/s HBM (16 GB)
    TPU v3   no numbers on the slide (a link only); Google's Cloud TPU v3 page: 123 TFLOPS bf16, 900 GB/s
    Titan X  (Maxwell, the persistent-RNN slide) "up to 6 MB" of registers: 24 SMs · 65,536 32-bit
             registers · 4 B = 6 MiB; 3072 cores · 2 · 1.0 GHz = 6.1 TFLOPS, 336 GB/s (datasheet)

Ridge point = peak / memory bandwidth (FLOPs per byte). The persistent RNN (Diamos et al., ICML 2016):
one step h ← σ(W·h) of N sequences costs 2·N·H² FLOPs; reloading W (H² · 4 B) every step makes its
intensity ≈ N/2, memory-bound unless N is large; keeping W in the register file leaves only h to move:
intensity 2·N·H² / (2·N·H · 4 B) = H/4, compute-bound for any N once H/4 exceeds the ridge.
"""

from __future__ import annotations

import math

import numpy as np

from minidist.hardware.roofline import Machine
from minidist.nn.checks import check_count

MHZ, GB, TERA = 1e6, 1e9, 1e12

TPU_V1_MACS = 256 * 256
V100_CLOCK = 1530 * MHZ              # NVIDIA V100 SXM2 datasheet boost clock (not on the slides)
TITAN_X_REGISTERS = 24 * 65536 * 4   # bytes: 24 SMs × 64 K 32-bit registers

DEVICES: dict[str, Machine] = {
    "TPU v1 (int8)": Machine(peak=TPU_V1_MACS * 2 * 700 * MHZ, memory_bw=2 * 2133 * MHZ * 8),
    "GP100 (FP32)": Machine(peak=10 * TERA, memory_bw=750 * GB),
    "GP100 (FP16)": Machine(peak=67e9 * 300, memory_bw=750 * GB),
    "V100 (FP32)": Machine(peak=5120 * 2 * V100_CLOCK, memory_bw=900 * GB),
    "V100 (tensor cores)": Machine(peak=640 * 64 * 2 * V100_CLOCK, memory_bw=900 * GB),
    "TPU v2": Machine(peak=45 * TERA, memory_bw=600 * GB),
    "TPU v3": Machine(peak=123 * TERA, memory_bw=900 * GB),
    "Titan X (Maxwell, FP32)": Machine(peak=3072 * 2 * 1.0e9, memory_bw=336 * GB),
}


def linear_crossing_batch(machine: Machine, in_features: int, out_features: int, itemsize: int = 4) -> float:
    """The smallest batch B at which Linear(in, out)'s forward reaches the ridge point, from
    I(B) = 2·B·i·o / (s·(B·i + i·o + o + B·o)) ≥ R  ⇔  B ≥ s·R·o·(i + 1) / (2·i·o − s·R·(i + o))
    (x, W, b and y each moved once, s = itemsize). math.inf when no batch gets there: as B → ∞ the
    intensity tends to 2·i·o / (s·(i + o)), which must exceed R."""
    if not isinstance(machine, Machine):
        raise TypeError(f"linear_crossing_batch needs a roofline Machine, got {type(machine).__name__}")
    i, o = check_count(in_features, "in_features"), check_count(out_features, "out_features")
    s, ridge = check_count(itemsize, "itemsize"), machine.ridge
    denominator = 2 * i * o - s * ridge * (i + o)
    if denominator <= 0:
        return math.inf
    return math.ceil(s * ridge * o * (i + 1) / denominator)


def rnn_step_cost(hidden: int, batch: int, persistent: bool, itemsize: int = 4) -> tuple[int, int]:
    """(FLOPs, bytes) of one recurrent step h ← σ(W_hh·h) for ``batch`` sequences: 2·N·H² FLOPs; bytes
    read h and write h (2·N·H·s), plus W_hh (H²·s) unless it stays on chip (``persistent``)."""
    hidden, batch = check_count(hidden, "rnn_step_cost hidden"), check_count(batch, "rnn_step_cost batch")
    itemsize = check_count(itemsize, "rnn_step_cost itemsize")
    if not isinstance(persistent, (bool, np.bool_)):
        raise TypeError(f"rnn_step_cost persistent must be True or False, got {persistent!r}")
    flops = 2 * batch * hidden * hidden
    nbytes = 2 * batch * hidden * itemsize + (0 if persistent else hidden * hidden * itemsize)
    return flops, nbytes


def largest_persistent_rnn(register_bytes: int, itemsize: int = 4) -> int:
    """The largest H whose H × H recurrent weight fits in ``register_bytes``: ⌊√(bytes / s)⌋."""
    register_bytes = check_count(register_bytes, "register_bytes", 0)
    return math.isqrt(register_bytes // check_count(itemsize, "itemsize"))
