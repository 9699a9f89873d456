"""Where a rank's real time goes: always-on wall-clock counters of the transport, and the run's ends.

The simulated clock (ledger.py) says how long a program would take on the modelled machine; these
counters say where *this* computer's time went, so a slow run can be explained instead of guessed at.
Every rank's process counts (``comm.wall``, shared by all its communicators, like the clock):

    in_calls   seconds inside send / recv / sendrecv (every collective is made of them)
    waiting    of those, seconds in ``Endpoint.wait``: blocked until a peer writes, or frees room
               (a bounded spin or a few yields, then asleep on the doorbell; mailbox.py)
    sleeps     how many times it went to sleep on its doorbell (each costs a wake-up)
    messages   in_calls - waiting: the per-message work (headers, copies into and out of shared memory,
               checks, the ledger's entries)

Two perf_counter() calls per call and per wait (about 0.1 us each, against several us per message).
``run_traced`` adds the run's two ends (``Trace.startup``, ``Trace.shutdown``): from its call until the
last rank's function began (processes forked, shared memory made), and from the last rank's return
until it returns (results and spans brought back, processes reaped). Spans travel as bytes of the
standard C pickler, as plain tuples (``pack_ledger``): the launcher's pipes pickle with ``dill`` in pure
Python, which took about a second per 4,000 spans; named tuples pickle 9 times slower than plain ones.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass

from .ledger import Span


@dataclass
class WallTimes:
    """Real seconds one rank's process spent in the transport (see the module docstring)."""

    in_calls: float = 0.0
    waiting: float = 0.0
    sleeps: int = 0

    @property
    def messages(self) -> float:
        """Seconds of per-message work: in_calls - waiting."""
        return self.in_calls - self.waiting


def now() -> float:
    """A clock every process of the machine shares (seconds; CLOCK_MONOTONIC): for the run's two ends."""
    return time.monotonic()


def pack_ledger(spans: list, clock: float, stats, began: float, returned: float) -> bytes:
    """What a rank sends back besides its result, as bytes of the C pickler (fast for many spans)."""
    plain = [tuple(span) for span in spans]
    return pickle.dumps((plain, clock, stats, began, returned), protocol=pickle.HIGHEST_PROTOCOL)


def unpack_ledger(data: bytes) -> tuple:
    """(spans, clock, stats, began, returned): the inverse of ``pack_ledger``."""
    plain, clock, stats, began, returned = pickle.loads(data)
    return list(map(Span._make, plain)), clock, stats, began, returned
