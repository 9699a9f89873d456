"""Stochastic rounding: only the two neighbours, exactly unbiased (binomial z-tests), fixed points, seeds.

Each property is checked on both implementations: the readable ``stochastic_round`` (the exercise) and
the bit-level fast path that ``quantize(..., rounding="stochastic")`` uses; a further test checks that
the fast path picks exactly the readable version's neighbours.

The statistical tests use N draws per value and require |z| < 5 for every value, where
z = (ups − N·p) / sqrt(N·p·(1 − p)) and p = (|x| − lo)/(hi − lo). With a correct implementation a single
|z| >= 5 has probability 5.7e-7, so the whole file fails by chance less than once in 10^4 runs; a bias
of 1% of p at N = 40,000 shifts z by ~1 for p = 0.5 — visible, and a wrong rounding rule is far off.
"""

import numpy as np
import pytest

from minidist.precision import BF16, FP8_E4M3, FP8_E5M2, FP16, FloatFormat, decode, quantize, stochastic_round
from minidist.precision.fast_rounding import _uniform_below
from tests.precision.rounding_diagnosis import diagnose_stochastic_round

N = 40_000
Z_BOUND = 5.0
SR = pytest.mark.exercise("stochastic_rounding")


@SR
@pytest.mark.diagnose
def test_stochastic_round_picks_the_two_neighbours_at_the_right_rate_case_by_case():
    wrong = diagnose_stochastic_round(stochastic_round)
    assert wrong is None, wrong


def fast(x, fmt, rng, saturate=False):
    return quantize(x, fmt, rounding="stochastic", rng=rng, saturate=saturate)


# the readable version is the exercise; the fast path does not go through it
ROUNDERS = [pytest.param(stochastic_round, id="readable", marks=SR), pytest.param(fast, id="fast")]


def neighbours(x: np.ndarray, fmt: FloatFormat) -> tuple[np.ndarray, np.ndarray]:
    """lo <= |x| <= hi, the adjacent non-negative values of fmt, from the decoded code table."""
    codes = np.arange(2 ** (fmt.total_bits - 1), dtype=np.uint64)
    table = decode(codes, fmt)
    table = table[np.isfinite(table)]
    i = np.searchsorted(table, np.abs(x), side="right") - 1
    return table[i], table[np.minimum(i + 1, table.size - 1)]


def z_scores(x: np.ndarray, fmt: FloatFormat, rng: np.random.Generator, lo=None, hi=None,
             rounder=fast) -> np.ndarray:
    """Round each of x N times; z-score of the number of round-ups against p = (|x| − lo)/(hi − lo)."""
    if lo is None:
        lo, hi = neighbours(x, fmt)
    p = (np.abs(x) - lo) / (hi - lo)
    assert ((p > 0.01) & (p < 0.99)).all(), "choose values with p away from 0 and 1"
    draws = rounder(np.repeat(x[None, :], N, axis=0), fmt, rng)
    magnitude = np.abs(draws)
    assert ((magnitude == lo) | (magnitude == hi)).all()          # only the two neighbours
    assert ((np.sign(draws) == np.sign(x)) | (magnitude == 0)).all()      # the sign is kept
    ups = (magnitude == hi).sum(axis=0)
    return (ups - N * p) / np.sqrt(N * p * (1 - p))


def fractions_between(lo: float, hi: float) -> np.ndarray:
    return lo + np.array([0.05, 0.25, 0.3, 0.5, 0.7, 0.9]) * (hi - lo)


@pytest.mark.parametrize("rounder", ROUNDERS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unbiased_in_normal_subnormal_and_tiny_ranges(dtype, rounder, rng):
    tiny = FP16.min_subnormal
    cases = np.concatenate([
        fractions_between(1.0, 1.0 + FP16.epsilon),                  # normal
        -fractions_between(3.0, 3.0 + 2 * FP16.epsilon),             # normal, negative
        fractions_between(5 * tiny, 6 * tiny),                       # subnormal
        -fractions_between(1000 * tiny, 1001 * tiny),                # subnormal, negative
        fractions_between(0.0, tiny)[1:],                            # below the smallest subnormal
        fractions_between(65472.0, 65504.0),                         # just below max_normal
    ]).astype(dtype)
    z = z_scores(cases, FP16, rng, rounder=rounder)
    assert np.abs(z).max() < Z_BOUND, z


@pytest.mark.parametrize("rounder", ROUNDERS)
@pytest.mark.parametrize("fmt", [FP8_E5M2, FP8_E4M3, BF16], ids=lambda f: f.name)
def test_unbiased_in_other_formats(fmt, rounder, rng):
    cases = np.concatenate([
        fractions_between(fmt.min_normal * 1.5, fmt.min_normal * 1.5 + fmt.min_normal * fmt.epsilon),
        -fractions_between(fmt.min_subnormal, 2 * fmt.min_subnormal),
        fractions_between(0.0, fmt.min_subnormal)[1:],
        -fractions_between(fmt.max_normal - fmt.max_normal * fmt.epsilon / 1.75, fmt.max_normal)[:3],
    ])
    lo, hi = neighbours(cases, fmt)
    assert (lo < hi).all()
    for dtype in (np.float32, np.float64):
        z = z_scores(cases.astype(dtype), fmt, rng, rounder=rounder)
        assert np.abs(z).max() < Z_BOUND, (dtype, z)


@pytest.mark.parametrize("rounder", ROUNDERS)
def test_far_below_smallest_subnormal_with_many_dropped_bits(rounder, rng):
    """float64 x = 0.375 · 2^−16 into E5M2 with 60 extra random bits below: p = 0.375 + 2^−61 ≈ 0.375."""
    x = np.array([np.ldexp(0.375, -16) + np.ldexp(1.0, -77), np.ldexp(3.0, -30)])
    lo, hi = neighbours(x, FP8_E5M2)
    assert (lo == 0).all() and (hi == FP8_E5M2.min_subnormal).all()
    draws = rounder(np.repeat(x[None, :], 200_000, axis=0), FP8_E5M2, rng)
    ups = (draws == FP8_E5M2.min_subnormal).sum(axis=0)
    p = x / FP8_E5M2.min_subnormal                                   # 0.375…, 3·2^−14
    z = (ups - 200_000 * p) / np.sqrt(200_000 * p * (1 - p))
    assert np.abs(z).max() < Z_BOUND, z


def test_uniform_below_is_exact_beyond_64_bits(rng):
    """P(True) = rest / 2^k for k > 64 (several random words per element)."""
    rest = np.array([2**63, 3 * 2**62, 2**63, 5], dtype=np.uint64)
    k = np.array([65, 66, 70, 3], dtype=np.int64)                    # p = 1/4, 3/16, 1/128, 5/8
    p = np.array([1 / 4, 3 / 16, 1 / 128, 5 / 8])
    hits = np.zeros(4)
    for _ in range(5):
        hits += _uniform_below(np.tile(rest, 20_000), np.tile(k, 20_000), rng).reshape(-1, 4).sum(axis=0)
    z = (hits - 100_000 * p) / np.sqrt(100_000 * p * (1 - p))
    assert np.abs(z).max() < Z_BOUND, z
    assert not _uniform_below(np.array([2**52], dtype=np.uint64), np.array([2000]), rng).any()


@pytest.mark.parametrize("rounder", ROUNDERS)
@pytest.mark.parametrize("fmt", [FP16, FP8_E5M2, FP8_E4M3], ids=lambda f: f.name)
def test_representable_values_never_move(fmt, rounder, rng):
    codes = np.arange(2**fmt.total_bits, dtype=np.uint64)
    values = decode(codes, fmt)
    values = values[np.isfinite(values)]
    for dtype in (np.float32, np.float64):
        x = np.tile(values.astype(dtype), 4)
        out = rounder(x, fmt, rng)
        assert (out.view(np.uint64 if dtype == np.float64 else np.uint32)
                == x.view(np.uint64 if dtype == np.float64 else np.uint32)).all()


@pytest.mark.parametrize("rounder", ROUNDERS)
def test_same_seed_same_bits_and_specials(rounder, rng):
    x = rng.standard_normal(10_000).astype(np.float32) * 1e-3
    a = rounder(x, FP8_E4M3, np.random.default_rng(7))
    b = rounder(x, FP8_E4M3, np.random.default_rng(7))
    c = rounder(x, FP8_E4M3, np.random.default_rng(8))
    assert (a.view(np.uint32) == b.view(np.uint32)).all() and (a != c).any()
    special = np.array([np.nan, np.inf, -np.inf, 1e6, 0.0, -0.0], dtype=np.float32)
    out = rounder(special, FP16, rng)
    assert np.isnan(out[0]) and list(out[1:4]) == [np.inf, -np.inf, np.inf]
    assert out[4] == 0 and np.signbit(out[5])
    sat = rounder(special, FP8_E4M3, rng, saturate=True)
    assert np.isnan(sat[0]) and list(sat[1:4]) == [448, -448, 448]


@pytest.mark.parametrize("rounder", ROUNDERS)
@pytest.mark.parametrize("bit_generator", [np.random.PCG64, np.random.MT19937])
def test_unbiased_when_only_two_bits_are_dropped(bit_generator, rounder):
    """float32 into a 21-bit-mantissa format drops 2 bits: p is exactly 1/4, 1/2 or 3/4 — every noise bit
    counts, so a generator that wasted one (e.g. even noise only) would be caught here. MT19937 has
    32-bit raw outputs and takes the other path to random words."""
    rng = np.random.Generator(bit_generator(11))
    fmt = FloatFormat(8, 21)
    ulp32 = 2.0**-23
    cases = np.array([1 + ulp32, 1 + 2 * ulp32, -(1 + 3 * ulp32), 3 * 2.0**-149, 2.0**-149], dtype=np.float32)
    quantum = fmt.min_subnormal                                         # 2^-147
    lo = np.array([1.0, 1.0, 1.0, 0.0, 0.0])
    hi = np.array([1 + 4 * ulp32, 1 + 4 * ulp32, 1 + 4 * ulp32, quantum, quantum])
    z = z_scores(cases, fmt, rng, lo, hi, rounder=rounder)
    assert np.abs(z).max() < Z_BOUND, z


class _ScriptedRng:
    """Stands in for a Generator in ``bernoulli``: integers() returns the scripted 53-bit draws in order."""

    def __init__(self, draws):
        self.draws = list(draws)

    def integers(self, low, high, size):
        assert (low, high) == (0, 2**53)
        out, self.draws = np.array(self.draws[:size], dtype=np.int64), self.draws[size:]
        return out


def test_bernoulli_is_exact_beyond_53_bits():   # bernoulli is the exercise's tool, outside its region
    """p = 2^-60 + 2^-100 has 53 zero bits first: only a draw that ties there (u's first 53 bits all 0)
    looks at p's next 53 bits, 2^46 + 2^6; a tie there too means u >= p exactly (nothing of p is left)."""
    from minidist.precision.rounding import bernoulli

    p = np.array([np.ldexp(1.0, -60) + np.ldexp(1.0, -100)] * 4 + [0.5, 0.0])   # 0.0 draws nothing
    nxt = 2**46 + 2**6
    rng = _ScriptedRng([0, 0, 0, 1, 2**52 - 1,       # round 1: three ties, one above p, one below 0.5
                        nxt - 1, nxt, nxt + 1])       # round 2: below, tie (u = p: not below), above
    assert bernoulli(p, rng).tolist() == [True, False, False, False, True, False]
    assert not rng.draws                             # no third round: every draw was used, none more


@SR
@pytest.mark.parametrize("fmt", [FP16, BF16, FP8_E5M2, FP8_E4M3], ids=lambda f: f.name)
def test_fast_path_picks_the_readable_neighbours(fmt, monkeypatch):
    """With every draw forced to "down" and then to "up", both versions give the same two values bitwise
    (the fast path's all-zero noise rounds toward zero, its all-ones noise away from zero)."""
    import minidist.precision.fast_rounding as fast_rounding
    import minidist.precision.rounding as rounding

    rng = np.random.default_rng(0)
    x64 = np.concatenate([rng.standard_normal(2000) * s for s in (1, fmt.min_normal, fmt.min_subnormal,
                                                                      fmt.max_normal / 4)]
                         + [[0.0, -0.0, fmt.max_normal, -fmt.min_subnormal / 3, np.inf, -np.inf, np.nan]])
    for dtype in (np.float32, np.float64):
        x = x64.astype(dtype)
        results = {}
        for direction in ("down", "up"):
            with monkeypatch.context() as m:
                m.setattr(rounding, "bernoulli", lambda p, rng, d=direction: (p > 0) if d == "up" else p < 0)
                results["readable", direction] = stochastic_round(x, fmt, rng)
            with monkeypatch.context() as m:
                noise = (lambda r, n, nbits, uint: np.zeros(n, uint)) if direction == "down" else \
                    (lambda r, n, nbits, uint: np.full(n, (1 << nbits) - 1, dtype=uint))
                m.setattr(fast_rounding, "_random_integers", noise)
                m.setattr(
                    fast_rounding,
                    "_uniform_below",
                    lambda rest, k, r, d=direction: (rest > 0) if d == "up" else np.zeros(rest.size, bool),
                )
                results["fast", direction] = fast(x, fmt, rng)
        negative = np.signbit(x)
        toward_zero = np.where(negative, results["readable", "up"], results["readable", "down"])
        away = np.where(negative, results["readable", "down"], results["readable", "up"])
        uint = np.uint32 if dtype == np.float32 else np.uint64
        for mine, theirs in ((results["fast", "down"], toward_zero), (results["fast", "up"], away)):
            same = (mine.view(uint) == theirs.astype(dtype).view(uint)) | (np.isnan(mine) & np.isnan(theirs))
            assert same.all(), (dtype, x[~same][:5], mine[~same][:5], theirs[~same][:5])


@pytest.mark.parametrize("rounder", ROUNDERS)
def test_non_bool_flags_are_refused(rounder, rng):
    x = np.ones(3, dtype=np.float32) * 1e6
    for flag in ("no", 0, 1, None, np.float64(1.0)):
        with pytest.raises(TypeError, match="saturate must be True or False"):
            rounder(x, FP16, rng, saturate=flag)
    assert np.isinf(rounder(x, FP16, rng, saturate=np.False_)).all()
    with pytest.raises(TypeError, match="finite_only"):
        FloatFormat(4, 3, finite_only="yes")
