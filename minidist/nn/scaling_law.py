"""A power law fitted to loss against model size (or compute), with the exponent's uncertainty.

Kaplan et al., "Scaling Laws for Neural Language Models" (2020), write the loss of a language model
with N (non-embedding) parameters as

    L(N) = (N_c / N)^α        so        log L = α·log N_c − α·log N,

a straight line in log-log coordinates; the same form holds for compute C. ``fit_power_law`` fits that
line by ordinary least squares on the n points (log x_i, log(L_i − L_∞)), where L_∞ ≥ 0 is an
irreducible loss the caller knows (0 by default: the plain power law):

    slope b = Σ (u_i − ū)(v_i − v̄) / S_uu,   S_uu = Σ (u_i − ū)²,   α = −b,   α·log x_c = v̄ + α·ū

with u = log x, v = log(L − L_∞). Its standard error comes from the residuals r_i (n − 2 degrees of
freedom: two fitted numbers):

    s² = Σ r_i² / (n − 2),      se(α) = s / √S_uu,      α ± t_{n−2, (1+confidence)/2} · se(α)

the Student-t interval of the ordinary least-squares slope, exact when the log-space residuals are
independent Gaussians of one variance. It says how well the points pin the line down, nothing about
whether a power law is the right model beyond the range of x fitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t  # scipy comes with scikit-learn, a dependency

from minidist.nn.checks import check_real, check_real_array


@dataclass(frozen=True)
class PowerLawFit:
    """L(x) = irreducible + (x_c / x)^alpha fitted in log space (see the module docstring).

    alpha: the exponent; alpha_se: its standard error; interval: (low, high), the t-interval at
    ``confidence``; intercept: α·log x_c, the fitted line being log(L − L_∞) = intercept − α·log x;
    irreducible: L_∞; residuals (n,): log(L − L_∞) minus the line at each point; n: the points."""

    alpha: float
    alpha_se: float
    interval: tuple[float, float]
    confidence: float
    intercept: float
    irreducible: float
    residuals: np.ndarray
    n: int

    @property
    def x_c(self) -> float:
        """The scale x_c with L − L_∞ = (x_c / x)^α: exp(intercept / α); refused for α = 0 (no such scale)."""
        if self.alpha == 0.0:
            raise ValueError("x_c is undefined for a fitted exponent alpha = 0 (a flat line)")
        return math.exp(self.intercept / self.alpha)

    def predict(self, x) -> np.ndarray:
        """x: positive sizes, any shape; returns the fitted loss L_∞ + exp(intercept) · x^(−α), same shape."""
        x = _positive(x, "x")
        return self.irreducible + np.exp(self.intercept - self.alpha * np.log(x))


def _positive(values, name: str) -> np.ndarray:
    """values as a float64 array of finite numbers > 0, else ValueError naming the first offender."""
    array = check_real_array(values, name, finite=True).astype(np.float64)
    if np.any(array <= 0):
        bad = float(array[array <= 0].flat[0])
        raise ValueError(f"{name} must be > 0 to take its logarithm, got {bad!r} at index "
                         f"{int(np.flatnonzero(array.ravel() <= 0)[0])}")
    return array


def fit_power_law(x, loss, *, irreducible: float = 0.0, confidence: float = 0.95) -> PowerLawFit:
    """Least-squares fit of log(loss − irreducible) = intercept − α·log x (see the module docstring).

    x: (n,) sizes (parameters, or compute in FLOPs), > 0, at least two distinct; loss: (n,) losses, each
    > irreducible; n ≥ 3 (the standard error needs n − 2 ≥ 1); irreducible: L_∞ ≥ 0, a known floor;
    confidence: the interval's level in (0, 1). Returns a PowerLawFit."""
    x = _positive(x, "x")
    loss = _positive(loss, "loss")
    if x.ndim != 1 or loss.shape != x.shape:
        raise ValueError(f"x and loss must be 1-D of one length, got shapes {x.shape} and {loss.shape}")
    if x.size < 3:
        raise ValueError(f"fit_power_law needs at least 3 points (n − 2 ≥ 1 for a standard error), "
                         f"got {x.size}")
    irreducible = check_real(irreducible, "irreducible", 0.0)
    if not 0.0 < check_real(confidence, "confidence") < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if irreducible >= loss.min():
        raise ValueError(f"irreducible must be below every loss, got {irreducible} with min(loss) = "
                         f"{loss.min()}")
    u, v = np.log(x), np.log(loss - irreducible)
    if np.unique(x).size < 2:
        raise ValueError(f"x needs at least two distinct values to fit a slope, got only {x[0]!r}")
    s_uu = float(np.sum((u - u.mean()) ** 2))
    slope = float(np.sum((u - u.mean()) * (v - v.mean())) / s_uu)
    alpha = -slope
    intercept = float(v.mean() - slope * u.mean())
    residuals = v - (intercept + slope * u)
    alpha_se = math.sqrt(float(np.sum(residuals ** 2)) / (x.size - 2) / s_uu)
    half_width = float(student_t.ppf(0.5 + confidence / 2, x.size - 2)) * alpha_se
    return PowerLawFit(alpha=alpha, alpha_se=alpha_se, interval=(alpha - half_width, alpha + half_width),
                       confidence=float(confidence), intercept=intercept, irreducible=irreducible,
                       residuals=residuals, n=int(x.size))
