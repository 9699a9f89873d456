"""Argument checks shared by every layer of minidist: sizes and counts, and real numbers.

A size or count must be an integer and never a bool: ``True`` is an int in Python (``True == 1``), so
without this check ``Grid3D(comm, True, 2, 2)`` would quietly build a 1 × 2 × 2 grid. A real number
(a bandwidth, a time) must be finite: NaN compares false with everything, so a NaN slips through
``x > 0`` checks and poisons every later result. Each check raises an error saying what was expected,
before the caller changes anything.
"""

from __future__ import annotations

import math

import numpy as np


def is_count(value, minimum: int = 1) -> bool:
    """True if ``value`` is an integer (Python or NumPy, not a bool) >= ``minimum``."""
    return (
        not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, np.integer)) and value >= minimum
    )


def check_count(value, name: str, minimum: int = 1) -> int:
    """``value`` as an int, or ValueError: "<name> must be an integer >= <minimum>, got ...". """
    if not is_count(value, minimum):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}"
                         + (" (a bool is not a count)" if isinstance(value, (bool, np.bool_)) else ""))
    return int(value)


def check_real(value, name: str, minimum: float = -math.inf, *, strict: bool = False) -> float:
    """``value`` as a float: a finite real number >= ``minimum`` (> with ``strict``). TypeError for a
    non-number (a string, a bool), ValueError for NaN, ±Inf or a value out of range."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        relation = ">" if strict else ">="
        raise ValueError(
            f"{name} must be a finite number{'' if minimum == -math.inf else f' {relation} {minimum:g}'}, "
            f"got {value!r}"
        )
    return value
