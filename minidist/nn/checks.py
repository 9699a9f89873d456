"""Argument checks shared by every layer of minidist: sizes and counts, and real numbers.

A size or count must be an integer and never a bool: ``True`` is an int in Python (``True == 1``), so
without this check ``Mesh(comm, data=True, pipeline=2, tensor=2)`` would quietly build a 1 × 2 × 2 mesh.
A real number (a bandwidth, a time) must be finite: NaN compares false with everything, so a NaN slips through
``x > 0`` checks and poisons every later result; an array of numbers must hold real numbers (no
strings, objects or complex values, which NumPy would otherwise coerce or drop quietly) and, where the
formula needs it, only finite ones. Each check raises an error saying what was expected, before the
caller changes anything. The command line's options go through the same rules
(``count_option``, ``seconds_option``): a bad value is argparse's one-line usage error (exit status 2)
naming the option, never a traceback and never a value quietly replaced.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

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


def check_real(value, name: str, minimum: float = -math.inf, *, strict: bool = False,
               maximum: float = math.inf) -> float:
    """``value`` as a float: a finite real number >= ``minimum`` (> with ``strict``) and <= ``maximum``.
    TypeError for a non-number (a string, a bool), ValueError for NaN, ±Inf or a value out of range."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < minimum or (strict and value == minimum) or value > maximum:
        relation = ">" if strict else ">="
        raise ValueError(
            f"{name} must be a finite number{'' if minimum == -math.inf else f' {relation} {minimum:g}'}"
            f"{'' if maximum == math.inf else f' and <= {maximum:g}'}, got {value!r}"
        )
    return value


def check_eps(eps, layer: str) -> float:
    """A normalisation's ε (added to a variance before the square root) as a float: finite and > 0, or
    the error of ``check_real`` naming "<layer>: eps" (NaN or Inf would turn every output into NaN or 0)."""
    return check_real(eps, f"{layer}: eps", 0.0, strict=True)


def check_distinct(names, what: str) -> None:
    """ValueError if ``names`` repeats one: "mesh axis names must be distinct, got ['data', 'data']"."""
    names = list(names)
    if len(set(names)) != len(names):
        raise ValueError(f"{what} must be distinct, got {names}")


def check_same_length(first, second, names: str) -> None:
    """ValueError unless the sized ``first`` and ``second`` (named ``names``, "xs and targets") have one
    length: "xs and targets must have one length (one target per input), got 3 and 2"."""
    if len(first) != len(second):
        raise ValueError(f"{names} must have one length (one item of each per step), "
                         f"got {len(first)} and {len(second)}")


def check_rank(rank, world_size: int, name: str = "rank") -> int:
    """``rank`` as an int in [0, world_size), or ValueError: "<name> must be an integer in [0, 4), got 4".
    ``world_size`` is the caller's, already checked as a count >= 1."""
    if not is_count(rank, 0) or rank >= world_size:
        raise ValueError(f"{name} must be an integer in [0, {world_size}), got {rank!r}")
    return int(rank)


def check_real_array(x, name: str, *, finite: bool = False) -> np.ndarray:
    """``x`` as an ndarray of real numbers (integer or floating dtype; bools, strings, objects and complex
    numbers are a TypeError). With ``finite``, a NaN or ±Inf element is a ValueError saying how many."""
    array = np.asarray(x)
    if array.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be an array of real numbers (integer or float), got {array.dtype}")
    if finite and array.dtype.kind == "f":
        bad = int(np.count_nonzero(~np.isfinite(array)))
        if bad:
            raise ValueError(f"{name} must be finite, got {bad} NaN or infinite value(s) of {array.size}")
    return array


def count_option(minimum: int = 1, what: str = "") -> Callable[[str], int]:
    """An argparse ``type=``: the option's text as an integer >= ``minimum``. Anything else (0, -2, 1.5,
    nan, True) stops the command: "argument --jobs: expected an integer >= 1, got '0'" (or "<what> must
    be an integer >= 1, ..." when ``what`` names the quantity)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            expected = f"{what} must be" if what else "expected"
            raise argparse.ArgumentTypeError(f"{expected} an integer >= {minimum}, got {text!r}")
        return value
    return parse


def seconds_option(text: str) -> float:
    """An argparse ``type=``: a finite number of seconds > 0; 0, -1, nan, inf stop the command with
    "argument --limit: expected a finite number of seconds > 0, got 'nan'"."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, got {text!r}")
    return value
