"""A weight-stationary systolic array, cycle by cycle (the TPU v1 Matrix Unit).

"Hardware Accelerators for Training DNNs" (TPU V1 slide): the Matrix Unit is 65,536 (256 × 256) 8-bit
multiply-accumulate units in a systolic array at 700 MHz, peak 65,536 · 2 · 700M = 92 T operations/s.

A k × k array of processing elements (PEs); PE (i, j) holds the weight W[i, j] (weight-stationary).
Every cycle each PE takes an activation from its left neighbour and a partial sum from the one above,
passes the activation right and partial + activation · weight down:

    a[i, j] ← a[i, j−1]                 psum[i, j] ← psum[i−1, j] + a[i, j−1] · W[i, j]

Row r of A enters row i of the array at cycle r + i (the input is skewed), so it meets the partial sum of
output (r, j) at PE (i, j) at cycle r + i + j, and C[r, j] leaves the bottom of column j at cycle
r + (k − 1) + j. One k × k tile streaming n rows therefore takes

    cycles = fill + stream + drain = (k − 1) + n + (k − 1)

(the first row needs k − 1 cycles to reach the last PE row; the last row needs k − 1 more to leave the
last column). A (n × K) @ W (K × M) runs as ⌈K/k⌉·⌈M/k⌉ tiles of W, one after another, each padded with
zeros and adding into an accumulator (TPU v1's 4 MB accumulator memory); weights are assumed loaded while
the previous tile streams (double buffering). Utilisation = n·K·M useful MACs / (k² · cycles): near 1 only
when n ≫ k and k divides K and M.
"""

from __future__ import annotations

import math

import numpy as np

from minidist.nn.checks import check_count, check_real_array


def tile_cycles(n: int, k: int) -> int:
    """Cycles of one k × k weight tile streaming n rows: fill (k − 1) + stream n + drain (k − 1)."""
    return (k - 1) + n + (k - 1)


def tile_schedule(K: int, M: int, k: int) -> list[tuple[slice, slice]]:
    """The weight tiles, in the order the array runs them: (rows of W, columns of W) for each, covering
    every element of the K × M weight exactly once; a tile is at most k × k (the last ones are smaller)."""
    _check_positive(K=K, M=M, k=k)
    # BEGIN SOLUTION systolic_tile_schedule
    return [(slice(k0, min(k0 + k, K)), slice(m0, min(m0 + k, M)))
            for m0 in range(0, M, k) for k0 in range(0, K, k)]
    # END SOLUTION


def cycles(n: int, K: int, M: int, k: int) -> int:
    """The closed form for A (n × K) @ W (K × M) on a k × k array: ⌈K/k⌉·⌈M/k⌉ tiles of n + 2(k − 1)."""
    _check_positive(n=n, K=K, M=M, k=k)
    return math.ceil(K / k) * math.ceil(M / k) * tile_cycles(n, k)


def utilisation(n: int, K: int, M: int, k: int) -> float:
    """Useful MACs n·K·M over the k²·cycles the array offers."""
    return n * K * M / (k * k * cycles(n, K, M, k))


def run_tile(a: np.ndarray, w: np.ndarray, real: np.ndarray | None = None,
             frames: list | None = None) -> tuple[np.ndarray, int, int]:
    """Stream a (n × k) through the array holding w (k × k), one cycle at a time.

    Returns (a @ w (n × k), cycles, busy PE-cycles: a PE holding a row of a and a real weight — ``real``
    (k × k bool) marks the PEs of a padded tile that hold one; default all). With ``frames`` (a list),
    appends each cycle's (k × k) array of the row of a at every PE (−1: idle)."""
    n, k = a.shape
    real = np.ones((k, k), bool) if real is None else real
    acts = np.zeros((k, k), dtype=np.result_type(a, w))      # activation register of every PE
    rows = np.full((k, k), -1)                               # which row of a that activation belongs to
    psum = np.zeros_like(acts)
    out = np.zeros((n, k), dtype=acts.dtype)
    busy = 0
    total = tile_cycles(n, k)
    for c in range(total):
        r_in = c - np.arange(k)                              # row of a entering array row i (skewed input)
        valid = (r_in >= 0) & (r_in < n)
        left = np.where(valid, a[np.clip(r_in, 0, n - 1), np.arange(k)], 0)
        rows = np.concatenate([np.where(valid, r_in, -1)[:, None], rows[:, :-1]], axis=1)
        acts = np.concatenate([left[:, None], acts[:, :-1]], axis=1)        # activations move right
        above = np.concatenate([np.zeros((1, k), acts.dtype), psum[:-1]], axis=0)
        psum = above + acts * w                              # partial sums move down
        busy += int(((rows >= 0) & real).sum())
        r_out = c - (k - 1) - np.arange(k)                   # row of C leaving the bottom of column j
        done = (r_out >= 0) & (r_out < n)
        out[r_out[done], np.arange(k)[done]] = psum[-1, done]
        if frames is not None:
            frames.append(rows.copy())
    return out, total, busy


def systolic_matmul(a: np.ndarray, w: np.ndarray, k: int) -> tuple[np.ndarray, int, int]:
    """A (n × K) @ W (K × M) on a k × k array, tile after tile (``tile_schedule``), each tile's result
    added into the accumulator. Returns (C (n × M), cycles, busy PE-cycles). Exact for integer arrays
    (int8 operands into wide accumulators, as TPU v1); for floats each output is summed in order of K."""
    if not (isinstance(a, np.ndarray) and isinstance(w, np.ndarray) and a.ndim == 2 and w.ndim == 2):
        raise TypeError("systolic_matmul expects 2-D numpy arrays a (n, K) and w (K, M)")
    if a.shape[1] != w.shape[0]:
        raise ValueError(f"systolic_matmul: inner dimensions differ, a {a.shape} and w {w.shape}")
    _check_positive(n=a.shape[0], k=k)
    check_real_array(a, "systolic_matmul a"), check_real_array(w, "systolic_matmul w")
    both_integer = a.dtype.kind in "iu" and w.dtype.kind in "iu"
    dtype = np.int64 if both_integer else np.result_type(a, w)     # int8 operands, a wide accumulator
    acc = np.zeros((a.shape[0], w.shape[1]), dtype=dtype)
    total = busy = 0
    for rows, cols in tile_schedule(w.shape[0], w.shape[1], k):
        h, wd = rows.stop - rows.start, cols.stop - cols.start
        tile, real = np.zeros((k, k), dtype=dtype), np.zeros((k, k), bool)      # an edge tile is padded
        tile[:h, :wd], real[:h, :wd] = w[rows, cols], True
        a_tile = np.zeros((a.shape[0], k), dtype=dtype)
        a_tile[:, :h] = a[:, rows]
        part, c, b = run_tile(a_tile, tile, real)
        acc[:, cols] += part[:, :wd]
        total, busy = total + c, busy + b
    return acc, total, busy


def _check_positive(**values: int) -> None:
    for name, v in values.items():
        check_count(v, name)
