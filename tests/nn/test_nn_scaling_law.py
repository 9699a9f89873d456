"""The power-law fit L(x) = L_inf + (x_c / x)^alpha: exact on noise-free points, its standard error equal to
the least-squares formula, its t-interval covering the true exponent at its stated rate, bad input refused."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minidist.nn.scaling_law import PowerLawFit, fit_power_law

KAPLAN_ALPHA_N, KAPLAN_N_C = 0.076, 8.8e13   # Kaplan et al. 2020, L(N) = (N_c / N)^alpha_N


def sizes(n, low=1e3, high=1e6):
    return np.geomspace(low, high, n)


@settings(max_examples=30)
@given(n=st.integers(3, 12), alpha=st.floats(-1.0, 1.0).filter(lambda a: abs(a) > 1e-3),
       log_x_c=st.floats(0.0, 40.0), irreducible=st.sampled_from([0.0, 0.5, 1.7]))
def test_noise_free_points_give_the_exponent_and_the_scale_back(n, alpha, log_x_c, irreducible):
    x = sizes(n)
    power = np.exp(alpha * (log_x_c - np.log(x)))
    assume(power.min() > 1e-2 * irreducible)   # else loss - L_inf cancels: log(loss - L_inf) loses digits
    loss = irreducible + power
    fit = fit_power_law(x, loss, irreducible=irreducible)
    assert isinstance(fit, PowerLawFit) and fit.n == n
    assert fit.alpha == pytest.approx(alpha, rel=1e-8, abs=1e-12)
    assert math.log(fit.x_c) == pytest.approx(log_x_c, rel=1e-6, abs=1e-6)
    assert fit.alpha_se < 1e-9 and np.max(np.abs(fit.residuals)) < 1e-9
    assert np.allclose(fit.predict(x), loss, rtol=1e-9)


@settings(max_examples=30)
@given(n=st.integers(3, 10), alpha=st.floats(0.01, 0.5), norm=st.floats(1e-3, 1.0),
       seed=st.integers(0, 2**16), confidence=st.sampled_from([0.5, 0.9, 0.95, 0.99]))
def test_the_standard_error_is_the_residuals_over_the_spread_of_log_x(n, alpha, norm, seed, confidence):
    # Noise orthogonal to the line's two columns [1, log x] moves no fitted number but the residuals:
    # the slope stays exact and se(alpha) = |r| / sqrt((n - 2) S_uu).
    from scipy.stats import t as student_t

    x = sizes(n)
    u = np.log(x)
    design = np.stack([np.ones(n), u], axis=1)
    noise = np.random.default_rng(seed).normal(size=n)
    noise -= design @ np.linalg.lstsq(design, noise, rcond=None)[0]
    noise *= norm / np.linalg.norm(noise)
    fit = fit_power_law(x, np.exp(alpha * (np.log(KAPLAN_N_C) - u) + noise), confidence=confidence)
    s_uu = np.sum((u - u.mean()) ** 2)
    assert fit.alpha == pytest.approx(alpha, rel=1e-9)
    assert fit.alpha_se == pytest.approx(norm / math.sqrt((n - 2) * s_uu), rel=1e-9)
    assert np.allclose(fit.residuals, noise, atol=1e-12)
    half = student_t.ppf(0.5 + confidence / 2, n - 2) * fit.alpha_se
    assert fit.interval == pytest.approx((alpha - half, alpha + half), rel=1e-9)


def test_three_points_use_the_t_quantile_of_one_degree_of_freedom():
    fit = fit_power_law([1.0, 10.0, 100.0], [3.0, 2.0, 1.5])
    assert (fit.interval[1] - fit.alpha) / fit.alpha_se == pytest.approx(12.7062, abs=1e-4)  # t_{0.975, 1}


def test_the_interval_covers_the_true_exponent_at_its_confidence():
    # 2,000 synthetic runs of six models with Kaplan's alpha_N and log-normal noise of 2 %: the 95 %
    # interval must hold the true exponent in 95 % of them (binomial sd 0.5 %: ±2 % is four sd), and the
    # spread of the fitted exponents must be the standard error's (sd of a 2,000-sample sd: 1.6 %).
    rng, x, sigma, runs = np.random.default_rng(57), sizes(6), 0.02, 2000
    u = np.log(x)
    clean = np.exp(KAPLAN_ALPHA_N * (np.log(KAPLAN_N_C) - u))
    fits = [fit_power_law(x, clean * np.exp(sigma * rng.normal(size=6))) for _ in range(runs)]
    covered = np.mean([f.interval[0] <= KAPLAN_ALPHA_N <= f.interval[1] for f in fits])
    assert 0.93 <= covered <= 0.97
    alphas = np.array([f.alpha for f in fits])
    expected_sd = sigma / math.sqrt(np.sum((u - u.mean()) ** 2))
    assert abs(alphas.mean() - KAPLAN_ALPHA_N) < 4 * expected_sd / math.sqrt(runs)
    assert alphas.std() == pytest.approx(expected_sd, rel=0.06)
    assert np.mean([f.alpha_se ** 2 for f in fits]) == pytest.approx(expected_sd ** 2, rel=0.06)


GOOD_X, GOOD_LOSS = [1e3, 1e4, 1e5], [3.0, 2.5, 2.1]


@pytest.mark.parametrize("x, loss, kwargs, error, words", [
    ([0.0, 1e4, 1e5], GOOD_LOSS, {}, ValueError, "x must be > 0"),
    ([-1e3, 1e4, 1e5], GOOD_LOSS, {}, ValueError, "got -1000.0 at index 0"),
    (GOOD_X, [3.0, 0.0, 2.1], {}, ValueError, "loss must be > 0"),
    (GOOD_X, [3.0, np.nan, 2.1], {}, ValueError, "loss must be finite"),
    ([1e3, np.inf, 1e5], GOOD_LOSS, {}, ValueError, "x must be finite"),
    (GOOD_X, [3.0, 2.5], {}, ValueError, "one length"),
    ([[1e3, 1e4, 1e5]], [GOOD_LOSS], {}, ValueError, "1-D"),
    ([1e3, 1e4], [3.0, 2.5], {}, ValueError, "at least 3 points"),
    ([1e3, 1e3, 1e3], GOOD_LOSS, {}, ValueError, "two distinct values"),
    (GOOD_X, GOOD_LOSS, {"confidence": 1.0}, ValueError, "confidence must lie in (0, 1)"),
    (GOOD_X, GOOD_LOSS, {"confidence": 0.0}, ValueError, "confidence must lie in (0, 1)"),
    (GOOD_X, GOOD_LOSS, {"irreducible": 2.1}, ValueError, "irreducible must be below every loss"),
    (GOOD_X, GOOD_LOSS, {"irreducible": -0.1}, ValueError, "irreducible must be a finite number >= 0"),
    (GOOD_X, GOOD_LOSS, {"irreducible": "0"}, TypeError, "irreducible must be a real number"),
    (["a", "b", "c"], GOOD_LOSS, {}, TypeError, "x must be an array of real numbers"),
])
def test_bad_input_is_refused_naming_the_argument(x, loss, kwargs, error, words):
    with pytest.raises(error) as caught:
        fit_power_law(x, loss, **kwargs)
    assert words in str(caught.value)


def test_a_flat_line_has_no_scale_and_predict_refuses_non_positive_sizes():
    fit = fit_power_law(GOOD_X, [2.0, 2.0, 2.0])
    assert fit.alpha == 0.0
    with pytest.raises(ValueError, match="x_c is undefined"):
        _ = fit.x_c
    with pytest.raises(ValueError, match="x must be > 0"):
        fit_power_law(GOOD_X, GOOD_LOSS).predict([1e3, 0.0])
