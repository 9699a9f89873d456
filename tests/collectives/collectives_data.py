"""Shared pieces of the collectives tests: integer-valued data and a hypothesis strategy for cases.

Integer values in [-8, 8] on at most 8 ranks keep every partial sum below 2048 in magnitude, so sums are
exact even in float16 and results can be compared bitwise with the exact answer.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

DTYPES = (np.float16, np.float32, np.float64)


def integer_valued(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    return rng.integers(-8, 9, size=shape).astype(dtype)


def rank_arrays(seed: int, world_size: int, shape, dtype) -> list[np.ndarray]:
    """One integer-valued array per rank, reproducible from the seed."""
    rng = np.random.default_rng(seed)
    return [integer_valued(rng, shape, dtype) for _ in range(world_size)]


def exact(arrays: list[np.ndarray], op: str) -> np.ndarray:
    """The exact reduction, in the arrays' dtype (sums of integers are exact in float64)."""
    stack = np.stack([a.astype(np.float64) for a in arrays])
    if op == "max":
        return stack.max(axis=0).astype(arrays[0].dtype)
    if op == "min":
        return stack.min(axis=0).astype(arrays[0].dtype)
    total = stack.sum(axis=0).astype(arrays[0].dtype)
    return np.divide(total, len(arrays)) if op == "mean" else total  # mean: same division as the library


# Shapes: 0-d to 3-d small arrays, or 1-d arrays of length 0..5000 (not divisible by, or shorter than, P).
shapes = st.one_of(
    st.integers(0, 5000).map(lambda n: (n,)),
    st.integers(0, 9).map(lambda n: (n,)),
    st.lists(st.integers(0, 7), min_size=0, max_size=3).map(tuple),
)
dtypes = st.sampled_from(DTYPES)
world_sizes = st.integers(1, 8)
seeds = st.integers(0, 2**32 - 1)


@st.composite
def cases(draw, ops=("sum",)):
    """A few (seed, shape, dtype, op) cases to run in one cluster start-up."""
    return [(draw(seeds), draw(shapes), draw(dtypes), draw(st.sampled_from(ops)))
            for _ in range(draw(st.integers(1, 3)))]
