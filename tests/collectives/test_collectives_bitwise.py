"""Every rank ends an allreduce with the same bytes — also for NaNs of either sign and any payload, for
±0.0 and ±inf, where IEEE arithmetic is not symmetric: NaN + NaN keeps the first operand's NaN, and
max(-0.0, +0.0) returns either zero. Partners that combine a + b on one side and b + a on the other
disagree (this failed for recursive doubling, which ``auto`` picks for short arrays).

hypothesis draws the world size (1-8), the dtype, the op and per-rank arrays mixing such values with
small integers; every algorithm runs in one cluster start-up and each rank's result is compared bitwise
(as unsigned integers) with rank 0's.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.cluster import run
from minidist.collectives import ALGORITHMS, allreduce

UINT = {np.float16: np.uint16, np.float32: np.uint32, np.float64: np.uint64}
# Bit patterns of quiet and signalling NaNs with different signs and payloads, per dtype
NANS = {np.float16: [0x7E00, 0xFE00, 0x7E01, 0xFC01, 0x7D55],
        np.float32: [0x7FC00000, 0xFFC00000, 0x7FC00001, 0xFF800123, 0x7FA00000],
        np.float64: [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000001, 0xFFF0000000000123,
                     0x7FF4000000000000]}
ORDINARY = [0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 2.0, -3.0]
ALL = [*ALGORITHMS, "auto"]


def special_values(rng: np.random.Generator, n: int, dtype) -> np.ndarray:
    """n values, each a NaN pattern or one of ORDINARY, drawn with rng."""
    nans = np.array(NANS[dtype], dtype=UINT[dtype]).view(dtype)
    pool = np.concatenate([nans, np.array(ORDINARY, dtype=dtype)])
    return pool[rng.integers(0, pool.size, n)]


def _every_algorithm(comm, seed, n, dtype, op):
    x = special_values(np.random.default_rng([seed, comm.rank]), n, dtype)
    return [allreduce(comm, x, op=op, algorithm=a).view(UINT[dtype]) for a in ALL]


@pytest.mark.slow
@given(world_size=st.integers(1, 8), seed=st.integers(0, 2**32 - 1), n=st.integers(0, 40),
       dtype=st.sampled_from(sorted(UINT, key=str)), op=st.sampled_from(["sum", "mean", "max", "min"]))
def test_every_rank_holds_the_same_bytes(world_size, seed, n, dtype, op):
    per_rank = run(_every_algorithm, world_size, seed, n, dtype, op)
    for algorithm, first in zip(ALL, per_rank[0], strict=True):
        for rank in range(1, world_size):
            got = per_rank[rank][ALL.index(algorithm)]
            assert np.array_equal(got, first), f"{algorithm} {op}: rank {rank} {got} != rank 0 {first}"


def _the_issue_cases(comm):
    nan = np.array([NANS[np.float64][comm.rank]], np.uint64).view(np.float64)      # +nan on 0, -nan on 1
    zero = np.array([0.0 if comm.rank else -0.0])
    return [allreduce(comm, x, op=op, algorithm="recursive_doubling").view(np.uint64)
            for x, op in ((nan, "sum"), (nan, "max"), (zero, "max"), (zero, "min"))]


def test_recursive_doubling_partners_agree_on_nan_sign_and_signed_zero():
    rank0, rank1 = run(_the_issue_cases, 2)
    for a, b in zip(rank0, rank1, strict=True):
        assert a.tobytes() == b.tobytes(), (hex(a[0]), hex(b[0]))
