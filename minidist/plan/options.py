"""The ``plan`` command's option types: each turns the option's text into its value or stops the command with
argparse's one-line usage error naming the option (exit status 2), never a traceback.

    size_option(minimum)  an integer >= minimum and <= 2**53 (a model size, a count of devices or
                          micro-batches: the planner multiplies them as floats, exact up to 2**53)
    memory_option         bytes per device: a number of GB (80), or with a unit: 80GB (10**9 bytes),
                          80GiB (2**30 bytes), 512MB, 512MiB; finite and > 0
    zero_option           ZeRO stages as a comma list among 0, 1, 2, 3 ("0,1")
    recompute_option      recomputation choices as a comma list among none, selective, full
"""

from __future__ import annotations

import argparse
import math
import re

from .model import RECOMPUTE

LARGEST = 2 ** 53
UNITS = {"": 1e9, "gb": 1e9, "gib": 2 ** 30, "mb": 1e6, "mib": 2 ** 20, "tb": 1e12, "tib": 2 ** 40}


def size_option(minimum: int = 1):
    """An argparse ``type=``: an integer in [minimum, 2**53]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not minimum <= value <= LARGEST:
            raise argparse.ArgumentTypeError(f"expected an integer from {minimum} to 2**53, got {text!r}")
        return value
    return parse


def memory_option(text: str) -> float:
    """Bytes per device from '80', '80GB', '80GiB', '512MiB' (a bare number is GB)."""
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([A-Za-z]*)\s*", text)
    value = math.nan
    if match and match.group(2).lower() in UNITS:
        try:
            value = float(match.group(1)) * UNITS[match.group(2).lower()]
        except ValueError:
            pass
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite size > 0 such as 80, 80GB or 80GiB, "
                                         f"got {text!r}")
    return value


def zero_option(text: str) -> tuple[int, ...]:
    """'0,1' -> (0, 1); each a ZeRO stage 0-3."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p in ("0", "1", "2", "3") for p in parts):
        raise argparse.ArgumentTypeError(f"expected ZeRO stages among 0,1,2,3 separated by commas, "
                                         f"got {text!r}")
    return tuple(int(p) for p in parts)


def recompute_option(text: str) -> tuple[str, ...]:
    """'none,full' -> ('none', 'full'); each among RECOMPUTE."""
    parts = tuple(p.strip() for p in text.split(","))
    if not all(p in RECOMPUTE for p in parts):
        raise argparse.ArgumentTypeError(f"expected among {','.join(RECOMPUTE)} separated by commas, "
                                         f"got {text!r}")
    return parts
