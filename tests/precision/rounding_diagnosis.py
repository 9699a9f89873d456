"""Diagnosing stochastic_round in its own terms: for which x, which neighbours lo and hi it should pick
from (and the spacing hi − lo), and whether it picked another value or hi at the wrong rate.

The cases are written out by hand in BF16 (7 mantissa bits: spacing 2^−7 in [1, 2)) and FP8 E4M3 (3
bits; subnormals below 2^−6 with spacing 2^−9): inside a binade, just below a binade's top, negative
(the magnitude rounds up with P = (|x| − |lo|)/spacing), subnormal, and an x already in the format. The
rate of hi in N draws is judged by z = (ups − N·p)/√(N·p·(1 − p)); |z| < 5 passes.
"""

import numpy as np

from minidist.precision import BF16, FP8_E4M3

N = 4000
#: (format, x, the neighbour toward 0, the neighbour away from 0, P(away from 0))
CASES = ((BF16, 1 + 3 / 512, 1.0, 1 + 1 / 128, 0.75),
         (BF16, 2 - 1 / 512, 2 - 1 / 128, 2.0, 0.75),
         (BF16, -(1 + 1 / 512), -1.0, -(1 + 1 / 128), 0.25),
         (BF16, 1.5, 1.5, 1.5, 0.0),
         (FP8_E4M3, 3 / 1024, 2 / 1024, 4 / 1024, 0.5),       # subnormal: spacing 2^−9
         (FP8_E4M3, 3 + 1 / 16, 3.0, 3.25, 0.25))


def diagnose_stochastic_round(stochastic_round) -> str | None:
    """The first case where stochastic_round(x, fmt, rng) leaves {lo, hi} or picks hi at the wrong rate."""
    for fmt, x, near, far, p in CASES:
        draws = stochastic_round(np.full(N, x), fmt, np.random.default_rng(7)).astype(np.float64)
        what = (f"stochastic_round(x = {x!r}, {fmt.name}): the neighbours are {near!r} (toward 0) and "
                f"{far!r} (away from 0), spacing {abs(far - near)!r}")
        others = sorted(set(draws[(draws != near) & (draws != far)].tolist()))
        if others:
            return f"{what}; it gave {others[:3]}, which is neither"
        ups = int(np.count_nonzero(draws == far)) if far != near else 0
        if p in (0.0, 1.0):
            if ups != N * p:
                return f"{what}: P(away from 0) should be {p}; it rounded away {ups} of {N} times"
            continue
        z = (ups - N * p) / np.sqrt(N * p * (1 - p))
        if abs(z) >= 5:
            return (f"{what}: P(away from 0) = (|x| − {abs(near)!r}) / spacing = {p}; it rounded away "
                    f"{ups} of {N} times ({ups / N:.3f}, z = {z:.1f})")
    return None
