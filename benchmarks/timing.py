"""The timing loop of the communication benchmarks: warm up, then the fastest of a few timed blocks.

The machine is shared (and this VM's cores run slower for a while after they idle), so one block says
little: each benchmark times ``blocks`` blocks of ``count`` calls, between barriers when several
processes take part, and keeps the fastest block.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BLOCKS = 5


def _nothing() -> None:
    pass


def best_block(once: Callable[[], object], count: int, warmup: int = 0, blocks: int = BLOCKS,
               barrier: Callable[[], object] = _nothing) -> float:
    """Seconds per call of ``once``: ``warmup`` untimed calls, then the fastest of ``blocks`` blocks of
    ``count`` calls, each block between two calls of ``barrier``."""
    for _ in range(warmup):
        once()
    best = float("inf")
    for _ in range(blocks):
        barrier()
        start = time.perf_counter()
        for _ in range(count):
            once()
        barrier()
        best = min(best, (time.perf_counter() - start) / count)
    return best
