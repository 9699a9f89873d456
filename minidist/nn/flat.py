"""Many arrays as one flat vector: flatten, copy back, or view.

A bucket of gradients, a ZeRO shard group, a compressed gradient or a parameter-server message is one
contiguous vector of n = Σ sizes elements: one collective, one codec call, one optimizer shard instead of
one per tensor. Two ways back to the arrays:

    flatten(arrays) -> flat;  ...;  unflatten(flat, arrays)     a copy there and back (2n element copies)
    views(flat, shapes) -> arrays                               the arrays *are* pieces of flat (no copy:
                                                                DDP's gradient_as_bucket_view, ZeRO's groups)
"""

from __future__ import annotations

import numpy as np


def flatten(arrays: list[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """The arrays (any shapes, one dtype) raveled and concatenated in order: shape (Σ sizes,).
    out: an optional 1-D buffer of that size and dtype to write into (reused from step to step)."""
    return np.concatenate([a.ravel() for a in arrays], out=out)


def unflatten(flat: np.ndarray, arrays: list[np.ndarray]) -> None:
    """Copy the consecutive pieces of flat (Σ sizes,) back into the arrays, in place."""
    for array, piece in zip(arrays, views(flat, [a.shape for a in arrays])):
        array[...] = piece


def views(flat: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """flat (Σ sizes,) cut into views of the given shapes, in order (writing a view writes flat)."""
    offsets = np.cumsum([0, *(int(np.prod(s)) for s in shapes)])
    return [flat[a:b].reshape(shape) for a, b, shape in zip(offsets[:-1], offsets[1:], shapes)]
