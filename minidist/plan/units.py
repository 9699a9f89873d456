"""Units for the planner's tables: the largest unit in which a number reads at least 1."""

from __future__ import annotations


def unit(largest: float, units: tuple[tuple[str, float], ...]) -> tuple[str, float]:
    """The largest unit (name, size) in which ``largest`` is at least 1 (the last one otherwise)."""
    return next(((name, size) for name, size in units if largest >= size), units[-1])


BYTES = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3), ("B", 1.0))
SECONDS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6))


def format_bytes(n: float) -> str:
    """n bytes in the largest unit that keeps it at least 1: 12.3 MB."""
    name, size = unit(n, BYTES)
    return f"{n / size:.1f} {name}"
