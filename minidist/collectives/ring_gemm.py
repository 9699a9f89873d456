"""A ring-shifted distributed GEMM: C = A B with A's row blocks fixed and B's row blocks passed around.

The bucket algorithm (Chan, Heimlich, Purkayastha and van de Geijn 2007, "Collective communication:
theory, practice, and experience") is the allgather in which every rank passes one block to its right
neighbour at each of P − 1 steps — the second phase of ring.py's allreduce (its first phase is the
bucket reduce-scatter). Here it carries B, and each step's block is used before it is passed on:

    A: (m, k), rank r holds rows A_r (np.array_split of m); B: (k, n), rank r holds rows B_r (split of k)
    C_r = A_r B = Σ_j A_r[:, cols of block j] B_j        (j = r, r − 1, ..., r − P + 1 mod P)

At step s = 0 .. P − 1 rank r multiplies by the block B_{(r − s) mod P} it holds, then (except after the
last step) sends it to r + 1 and receives B_{(r − s − 1) mod P} from r − 1. No rank ever holds all of
B: P − 1 messages per rank, (P − 1)/P · k n elements of B when P divides k, and T = (P − 1)(α + (k/P) n β)
of communication beside P block products of (m/P, k/P) × (k/P, n).
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.common import TAGS, agree, check_array, check_comm, dtype_name
from minidist.collectives.pieces import split_range, split_sizes


def ring_gemm(comm, a_rows: np.ndarray, b_rows: np.ndarray) -> np.ndarray:
    """Rank r's row block of C = A B, by the bucket algorithm on B's row blocks.

    a_rows: (m_r, k), this rank's rows of A (any m_r, k the same everywhere). b_rows: (k_r, n), this
    rank's rows of B, k_r = split_sizes(k, P)[r] (np.array_split's rule), n the same everywhere. Returns a
    new (m_r, n) array: rows of A_r B in a_rows' and b_rows' result dtype, exact for integer data.
    """
    check_comm(comm)
    a_rows, b_rows = check_array(a_rows, "a_rows"), check_array(b_rows, "b_rows")
    p, r, tag = comm.world_size, comm.rank, TAGS["ring_gemm"]
    if a_rows.ndim != 2 or b_rows.ndim != 2:
        raise ValueError(f"ring_gemm: a_rows and b_rows must be 2-D, got shapes {a_rows.shape}, "
                         f"{b_rows.shape}")
    k = a_rows.shape[1]
    if b_rows.shape[0] != split_sizes(k, p)[r]:
        raise ValueError(f"ring_gemm: b_rows on rank {r} must have {split_sizes(k, p)[r]} rows (block {r} "
                         f"of k = {k} rows split over {p} ranks), got shape {b_rows.shape}")
    agree(comm, f"ring_gemm(k={k}, n={b_rows.shape[1]}, dtype={dtype_name(b_rows.dtype)})")
    c_rows = np.zeros((a_rows.shape[0], b_rows.shape[1]), np.result_type(a_rows, b_rows))
    block = b_rows
    for s in range(p):
        lo, hi = split_range(k, p, (r - s) % p)         # the rows of B this block holds
        c_rows += a_rows[:, lo:hi] @ block
        if s < p - 1:                                   # pass it right, take the next from the left
            block = comm.sendrecv(block, dst=(r + 1) % p, src=(r - 1) % p, sendtag=tag, recvtag=tag)
    return c_rows
