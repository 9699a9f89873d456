"""A rank's part of the global batch, cut in one place, and the check that every rank was given the same.

Every rank is given the whole batch x, y (N, T). Token set s = d·E + j (data rank d, expert rank j of E)
trains rows [s·N/S, (s+1)·N/S), S = D·E; with a context axis of C ranks, of each row the zigzag positions
of context rank k (context/layout.py: chunks k and 2C − 1 − k of 2C). Pipeline and tensor ranks of a
token set see the same tokens.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..context.layout import positions


def check_batch(x, y, mesh, micro_batches: int, block_size: int, vocab_size: int, sequence_parallel: bool):
    """x, y as arrays after the checks every rank makes alike; ValueError naming what does not fit."""
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim != 2 or y.shape != x.shape:
        raise ValueError(f"expected tokens and targets of one shape (N, T), got {x.shape}, {y.shape}")
    if x.shape[1] > block_size:
        raise ValueError(f"a sequence of {x.shape[1]} tokens is longer than the model's block_size = "
                         f"{block_size}")
    for name, ids in (("tokens", x), ("targets", y)):
        integer = np.issubdtype(ids.dtype, np.integer)
        if not integer or ids.size and not 0 <= ids.min() <= ids.max() < vocab_size:
            raise ValueError(f"{name} must be integer ids in [0, vocab_size = {vocab_size})")
    s = mesh.sizes
    parts = s["data"] * s["expert"] * micro_batches
    if len(x) % parts:
        raise ValueError(f"a batch of {len(x)} does not split into data × expert × micro_batches = "
                         f"{parts} equal parts")
    if s["context"] > 1 and x.shape[1] % (2 * s["context"]):
        raise ValueError(f"a sequence of {x.shape[1]} does not split into 2·context = "
                         f"{2 * s['context']} zigzag chunks")
    if sequence_parallel and x.shape[1] // s["context"] % s["tensor"]:
        raise ValueError(f"sequence parallelism cuts a rank's {x.shape[1] // s['context']} positions into "
                         f"tensor = {s['tensor']} equal pieces: they do not divide")
    return x, y


def check_same_batch(comm, x: np.ndarray, y: np.ndarray) -> None:
    """ValueError on every rank unless every rank of comm was given the same x and y: a 63-bit digest
    (blake2b) compared by ``comm.all_equal`` — the communicator's own check, not counted in its stats and
    free on the simulated clock (so the planner's prediction of a step is unchanged)."""
    digest = hashlib.blake2b(digest_size=8)
    for a in (x, y):
        digest.update(repr((a.shape, a.dtype.str)).encode())
        digest.update(np.ascontiguousarray(a).tobytes())
    if not comm.all_equal(int.from_bytes(digest.digest(), "little") >> 1):
        raise ValueError("the ranks were given different batches: every rank must be given the whole "
                         "global batch (x, y), the same on all of them (parallelize slices it)")


def my_part(x: np.ndarray, y: np.ndarray, mesh) -> tuple[np.ndarray, np.ndarray]:
    """This rank's rows of the batch (its token set's) and, with a context axis, its zigzag positions."""
    s, at = mesh.sizes, mesh.coords
    sets, n = s["data"] * s["expert"], len(x)
    k = at["data"] * s["expert"] + at["expert"]
    x, y = x[k * n // sets:(k + 1) * n // sets], y[k * n // sets:(k + 1) * n // sets]
    if s["context"] > 1:
        where = positions(x.shape[1], s["context"], at["context"])
        x, y = x[:, where], y[:, where]
    return x, y
