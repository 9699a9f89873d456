"""Traffic counters, the simulated alpha-beta clock, and the trace of every span.

The machine model: a message of n bytes costs T = alpha + beta * n seconds (alpha = latency, beta =
seconds per byte = 1 / bandwidth), the model of the "Distributed Deep Learning (Part II)" slides, where
a ring allreduce of |W| bytes costs 2(P-1)(alpha + beta |W| / P). A ``Device`` computes ``flops``
FLOP/s and holds ``memory`` bytes (a V100 by default: the "Hardware Accelerators for Training Deep
Neural Networks" tutorial).

Every rank has its own clock. ``send`` advances the sender's clock by alpha + n beta and stamps the
message with its arrival time; ``recv`` completes at ``max(own clock, arrival)`` (waiting for a late
message is idle time); ``comm.compute(flops)`` charges flops / device.flops, ``comm.elapse(seconds)``
charges seconds; ``barrier()`` is ideal: every clock jumps to the latest. The clock says how long the
program would take on the modelled machine, whatever this computer's real speed. Given a ``Topology``
instead of a LinkModel (topology.py), a send is charged by the link it crosses (inside a node or between
nodes) and its spans carry that level.

    results, trace = run_traced(fn, world_size, *args)   # same arguments as run(...)
    trace.spans            # Span(rank, start, end, kind, label, peer, nbytes), by rank then time
    trace.clocks, trace.stats                # final clock and world-communicator Stats of each rank
    trace.save_chrome("ring.json")           # open in https://ui.perfetto.dev or chrome://tracing

Spans are kept only under ``run_traced`` (under ``run`` the clock and counters run the same, but a
long run does not pile up two tuples per message). ``comm.stats`` counts payload bytes and messages of
one communicator; headers, barriers and ``split`` bookkeeping are not counted, so the numbers can be
compared with the textbook formulas exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np


@dataclass(frozen=True)
class LinkModel:
    """Cost of one message of n bytes: ``alpha + n * beta`` seconds.

    Defaults: alpha = 5 us (a small message across a modern interconnect, software included) and
    beta = 1 / (25 GB/s), one NVLink-2 link in one direction (the V100's 300 GB/s is 6 links, both
    directions). InfiniBand EDR would be alpha ~ 1-2 us, beta = 1 / (12.5 GB/s).
    """

    alpha: float = 5e-6
    beta: float = 1 / 25e9

    def __post_init__(self):
        if not (self.alpha >= 0 and self.beta >= 0 and np.isfinite(self.alpha) and np.isfinite(self.beta)):
            raise ValueError(
                f"LinkModel expects finite alpha >= 0 and beta >= 0, got {self.alpha}, {self.beta}"
            )

    def time(self, nbytes: int) -> float:
        """Seconds to send one message of ``nbytes`` bytes: alpha + nbytes * beta."""
        return self.alpha + nbytes * self.beta


def checked_link(link, world_size: int):
    """The link model of a run: LinkModel() for None; a Topology (topology.py) must cover world_size."""
    if link is None:
        return LinkModel()
    if hasattr(link, "check_covers"):
        link.check_covers(world_size)
    elif not isinstance(link, LinkModel):
        raise TypeError(f"link must be a LinkModel or a Topology, got {type(link).__name__}")
    return link


@dataclass(frozen=True)
class Device:
    """An accelerator: ``flops`` FLOP/s and ``memory`` bytes.
    Default: a V100 in FP32 (15.7 TFLOP/s, 16 GiB)."""

    flops: float = 15.7e12
    memory: int = 16 * 2**30

    def __post_init__(self):
        if not (self.flops > 0 and self.memory > 0):
            raise ValueError(f"Device expects flops > 0 and memory > 0, got {self.flops}, {self.memory}")


@dataclass
class Stats:
    """Cumulative payload counters of one communicator (headers and barriers excluded)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0


class Span(NamedTuple):
    """One busy or waiting interval of one rank on the simulated clock (seconds)."""

    rank: int
    start: float
    end: float
    kind: str          # "send", "recv", "compute", "barrier"
    label: str
    peer: int = -1     # the other rank of a send/recv (world rank), -1 otherwise
    nbytes: int = 0
    level: str = ""    # under a Topology: "intra" or "inter" (the link a send/recv crossed), else ""


class Ledger:
    """The simulated clock and the spans of one process (shared by all its communicators).

    Spans are kept as plain tuples and their send/recv labels are written only when ``spans`` is read:
    a message costs the sender and the receiver one tuple each, not a formatted string. With
    ``keep_spans=False`` (``run``) the clock runs but no span is stored, and ``spans`` is empty.
    """

    def __init__(self, rank: int, link: LinkModel, device: Device, keep_spans: bool = True):
        self.rank, self.link, self.device = rank, link, device
        self._route = getattr(link, "message_time", None)    # a Topology charges per link (topology.py)
        self.clock = 0.0
        self.keep_spans = keep_spans
        self._records: list[tuple] = []       # (start, end, kind, label or None, peer, nbytes)

    @property
    def spans(self) -> list[Span]:
        """The spans recorded so far (empty with ``keep_spans=False``), in time order."""
        spans = [Span(self.rank, start, end, kind, _label(kind, label, peer, nbytes), peer, nbytes)
                 for start, end, kind, label, peer, nbytes in self._records]
        if self._route is None:
            return spans
        levels = [self._level(s) for s in spans]
        return [s._replace(level=lv, label=f"{s.label} ({lv})") if lv else s for s, lv in zip(spans, levels)]

    def _level(self, span: Span) -> str:
        """The link level ("intra"/"inter") of a send/recv span under a Topology, else ""."""
        return self.link.level(self.rank, span.peer) if span.kind in ("send", "recv") else ""

    def drop_spans(self) -> None:
        """Forget the spans recorded so far; the clock keeps its time."""
        self._records.clear()

    def record(self, kind: str, end: float, label: str | None, peer: int = -1, nbytes: int = 0) -> None:
        """Record the span from the current clock to ``end`` and move the clock there (label None: a
        send/recv span, labelled when read)."""
        if self.keep_spans:
            self._records.append((self.clock, end, kind, label, peer, nbytes))
        self.clock = end

    def send(self, nbytes: int, peer: int) -> float:
        """Charge one send of ``nbytes`` payload bytes to world rank ``peer`` (alpha + nbytes * beta);
        return the message's arrival time at the receiver (simulated seconds)."""
        start = self.clock
        if self._route is None:
            self.clock = start + self.link.alpha + nbytes * self.link.beta      # link.time(nbytes), inlined
        else:
            self.clock = start + self._route(self.rank, peer, nbytes)          # the link this message crosses
        if self.keep_spans:
            self._records.append((start, self.clock, "send", None, peer, nbytes))
        return self.clock

    def recv(self, arrival: float, nbytes: int, peer: int) -> None:
        """Charge one receive from world rank ``peer``: the clock moves to max(clock, ``arrival``)."""
        start = self.clock
        self.clock = max(start, arrival)
        if self.keep_spans:
            self._records.append((start, self.clock, "recv", None, peer, nbytes))

    def compute(self, flops: float, label: str = "") -> None:
        """Charge ``flops`` (>= 0) floating-point operations: the clock advances by flops / device.flops."""
        if not flops >= 0:
            raise ValueError(f"compute expects flops >= 0, got {flops}")
        self.record("compute", self.clock + flops / self.device.flops, label or f"{flops:.3g} flop")

    def elapse(self, seconds: float, label: str = "") -> None:
        """Charge ``seconds`` (>= 0) of work: the clock advances by that much."""
        if not seconds >= 0:
            raise ValueError(f"elapse expects seconds >= 0, got {seconds}")
        self.record("compute", self.clock + seconds, label or f"{seconds:.3g} s")


@dataclass
class Trace:
    """What ``run_traced`` brings back: every rank's spans, final clock and world-communicator stats;
    ``startup``, ``shutdown``: real seconds before the last rank's function began and after the last
    returned (minidist.cluster.wall)."""

    spans: list[Span]
    clocks: list[float]
    stats: list[Stats]
    startup: float = 0.0
    shutdown: float = 0.0
    world_size: int = field(init=False)

    def __post_init__(self):
        self.world_size = len(self.clocks)

    def rank_spans(self, rank: int) -> list[Span]:
        """The spans of one rank, in time order."""
        return [s for s in self.spans if s.rank == rank]

    def chrome_events(self) -> list[dict]:
        """Chrome trace events: one process, one thread (track) per rank, times in microseconds."""
        events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}}
                  for r in range(self.world_size)]
        for s in self.spans:
            events.append({"name": s.label, "cat": s.kind, "ph": "X", "pid": 0, "tid": s.rank,
                           "ts": s.start * 1e6, "dur": (s.end - s.start) * 1e6,
                           "args": {"peer": s.peer, "bytes": s.nbytes, "level": s.level}})
        return events

    def save_chrome(self, path: str | Path) -> Path:
        """Write the Chrome trace-event JSON (open it in https://ui.perfetto.dev or chrome://tracing)."""
        path = Path(path)
        path.write_text(json.dumps({"traceEvents": self.chrome_events(), "displayTimeUnit": "ns"}))
        return path


def _label(kind: str, label: str | None, peer: int, nbytes: int) -> str:
    """A span's label; send/recv spans get theirs here: 'send 4.0 KiB to 3'."""
    if label is not None:
        return label
    return f"send {_size(nbytes)} to {peer}" if kind == "send" else f"recv {_size(nbytes)} from {peer}"


def _size(nbytes: int) -> str:
    """4096 -> '4.0 KiB'."""
    for unit in ("B", "KiB", "MiB"):
        if nbytes < 1024 or unit == "MiB":
            return f"{nbytes} B" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""
