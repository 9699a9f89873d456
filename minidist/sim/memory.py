"""A memory ledger per rank: the bytes a training step holds, by category, over time.

Where a step's memory goes ("Storing Parameters", the "Scaling Up Training" slides; the HOT CHIPS
tutorial's "the internal state may occupy 2-6X as much memory as the model itself" and "activations
... a major fraction of the memory"):

    parameters    W (and registered buffers such as running statistics)         b·Ψ bytes
    gradients     dW                                                              b·Ψ
    optimizer     momentum, Adam's m and v, ...                                   K·Ψ  (K = b per state array)
    activations   what forward keeps for backward (each layer's saved arrays)
    buffers       communication buffers (flat bucket buffers, ...)

Nothing here is a formula: ``held_bytes`` walks the arrays a model, an optimizer and a wrapper actually
hold and adds up their distinct memory (a view counts through its base, once, in the first category
that claims it). The code that allocates calls ``record`` at defined points of a step; the ledger keeps
the timeline, the peak, and Chrome-trace counter events ("ph": "C") that merge with the cluster's trace.

    ledger = MemoryLedger(rank)
    record(ledger, "after forward", model, optimizer, time=comm.clock)
    ledger.peak(), ledger.timeline, ledger.chrome_events()

``MemoryRecorder`` is the ledger as a step-runner attachment: held bytes recorded at the runner's events.
A strategy says *what* a rank holds (``held()``, {category: bytes} as held_bytes measures it) and *at
which layers* a point is worth recording; the recorder records, the same way for every strategy
(DataParallel, ZeRO, FSDP):

    after_loss               "after forward"        activations at their peak, before backward frees them
    after_forward(i)         forward_points[i]      FSDP: a layer's gathered parameters, before they are freed
    after_backward(i)        backward_points[i]     a bucket is complete / a gathered layer's full gradient
    end of forward_backward  "after backward"       once mixed precision has put the masters back
    record("after step")     called by the strategy after its optimizer step (outside the runner)

Where the recorder sits in the runner's list decides what it sees at the after_* events, which fire in
reverse order: placed after the strategy it records what the strategy is about to free (ZeRO, FSDP);
placed before it, what the strategy has just done (DataParallel's bucket buffers, once allocated).
Cost: one held_bytes walk per point; without a ledger (None) nothing is measured.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from minidist.nn.checkpoint import assigned_since
from minidist.nn.checks import check_count, check_real
from minidist.nn.nbytes import distinct_nbytes, module_arrays, nbytes_of
from minidist.nn.runner import Attachment

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "buffers")
MODEL_STATES = ("parameters", "gradients", "optimizer")   # what the ZeRO paper's formulas count


def held_bytes(model=None, optimizer=None, *, parameters=(), buffers=(), extra=None) -> dict[str, int]:
    """Bytes held right now, by category (see the module docstring).

    model: a Module (its parameters' data and grad, its buffers, its layers' saved arrays), or None.
    optimizer: an optimizer (every array in ``optimizer.state``), or None.
    parameters: extra Parameters a wrapper holds (e.g. a shard): data -> parameters, grad -> gradients.
    buffers: communication buffers (arrays; None entries are skipped).
    extra: {category: [arrays]} held elsewhere (e.g. mixed precision's fp32 master shards: "optimizer").
    A Parameter whose data or grad is None (freed by a sharded wrapper) holds nothing.
    Returns {category: bytes} for every category of CATEGORIES (minidist/nn/nbytes.py counts).
    """
    claims = {**module_arrays(model, parameters),
              "optimizer": list(optimizer.state) if optimizer is not None else [], "buffers": list(buffers)}
    for category, arrays in (extra or {}).items():
        if category not in CATEGORIES:
            raise ValueError(f"unknown memory category {category!r}; expected one of {CATEGORIES}")
        claims[category] = claims[category] + list(arrays)
    return distinct_nbytes({category: claims[category] for category in CATEGORIES})


class MemoryLedger:
    """The timeline of one rank's held bytes: ``record(label, held, time)`` appends a point.

    timeline: list of (time in seconds, label, {category: bytes}); times without a caller's clock are
    1 µs after the previous point. Byte counts are integers >= 0 and times finite and never decreasing
    (a bad point raises ValueError/TypeError and is not recorded).
    """

    def __init__(self, rank: int = 0):
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 0:
            raise ValueError(f"MemoryLedger: rank must be an integer >= 0, got {rank!r}")
        self.rank = int(rank)
        self.timeline: list[tuple[float, str, dict[str, int]]] = []

    def record(self, label: str, held: dict[str, int], time: float | None = None) -> None:
        """Append one point. held: {category: bytes} (missing categories count 0); time: seconds."""
        unknown = set(held) - set(CATEGORIES)
        if unknown:
            raise ValueError(f"unknown memory categories {sorted(unknown)}; expected some of {CATEGORIES}")
        counts = {c: check_count(held.get(c, 0), f"held bytes of {c!r}", 0) for c in CATEGORIES}
        last = self.timeline[-1][0] if self.timeline else None
        if time is None:
            time = 0.0 if last is None else last + 1e-6
        time = check_real(time, "time" if last is None else f"time (never before the last point, {last:g} s)",
                          0.0 if last is None else last)
        self.timeline.append((time, str(label), counts))

    def total(self, index: int = -1) -> int:
        """Total bytes of one point (the last by default)."""
        if not self.timeline:
            raise ValueError("the ledger is empty: nothing recorded yet")
        return sum(self.timeline[index][2].values())

    def peak(self, category: str | tuple | None = None) -> int:
        """The largest total over the timeline, or the largest value of one category, or of the sum of a
        tuple of categories (e.g. ("parameters", "gradients", "optimizer"): the model states); 0 if empty."""
        chosen = (
            CATEGORIES if category is None else (category,) if isinstance(category, str) else tuple(category)
        )
        if not chosen or not set(chosen) <= set(CATEGORIES):
            raise ValueError(f"category must be one of {CATEGORIES} (or a tuple of them), got {category!r}")
        return max((sum(h[c] for c in chosen) for _, _, h in self.timeline), default=0)

    def peak_point(self) -> tuple[float, str, dict[str, int]]:
        """The (time, label, held) point with the largest total (the first of equals)."""
        if not self.timeline:
            raise ValueError("the ledger is empty: nothing recorded yet")
        return max(self.timeline, key=lambda point: sum(point[2].values()))

    def chrome_events(self, pid: int = 0) -> list[dict]:
        """Counter events, one per point, on a track "memory rank r" (bytes per category, stacked);
        ts in µs, the unit of the cluster trace's events, so both lists can simply be concatenated."""
        return [{"name": f"memory rank {self.rank}", "ph": "C", "pid": pid, "tid": self.rank,
                 "ts": time * 1e6, "args": dict(held)} for time, _, held in self.timeline]


def record(ledger: MemoryLedger | None, label: str, model=None, optimizer=None, *, parameters=(),
           buffers=(), extra=None, time: float | None = None) -> dict[str, int] | None:
    """Measure with ``held_bytes`` and append the point to ledger (nothing happens if ledger is None).
    Returns the measured {category: bytes}, or None without a ledger."""
    if ledger is None:
        return None
    held = held_bytes(model, optimizer, parameters=parameters, buffers=buffers, extra=extra)
    ledger.record(label, held, time)
    return held


def save_chrome(path: str | Path, *event_lists: list[dict]) -> Path:
    """Write trace events (e.g. ``trace.chrome_events()`` and each ledger's ``chrome_events()``) as one
    Chrome trace-event JSON file (https://ui.perfetto.dev)."""
    path = Path(path)
    events = [event for events in event_lists for event in events]
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
    return path


class MemoryRecorder(Attachment):
    """Appends ``held()`` to ``ledger`` (a MemoryLedger or None) at the points above.

    Args:
        ledger: where the points go; None records nothing.
        held: a function () -> {category: bytes}, what the rank holds now.
        comm: the Communicator whose simulated clock stamps each point.
        forward_points, backward_points: {layer index: label} of the runner's units to record after.
    """

    def __init__(self, ledger, held: Callable[[], dict[str, int]], comm, *,
                 forward_points: dict[int, str] | None = None, backward_points: dict[int, str] | None = None):
        self.ledger, self.held, self.comm = ledger, held, comm
        self.forward_points, self.backward_points = forward_points or {}, backward_points or {}
        self._backward_done = False

    def record(self, label: str) -> None:
        """Append one point, stamped with the simulated clock (nothing without a ledger)."""
        if self.ledger is not None:
            self.ledger.record(label, self.held(), self.comm.clock)

    def begin(self, runner) -> None:
        self._backward_done = False

    def after_forward(self, i, layer, y):
        if i in self.forward_points:
            self.record(self.forward_points[i])
        return y

    def after_loss(self, dy):
        self.record("after forward")
        return dy

    def after_backward(self, i, layer, dx):
        if i in self.backward_points:
            self.record(self.backward_points[i])
        return dx

    def end_backward(self) -> None:
        self._backward_done = True

    def end(self) -> None:
        if self._backward_done:
            self.record("after backward")


class ActivationPeak(Attachment):
    """The runner's peak of activation bytes, counted as a pipeline stage's ledger counts them: after each
    forward, the attributes the units assigned since the pass began (nn.checkpoint's rule) and the loss
    gradient; released after the backward, as the executor releases a micro-batch's. ``peak``: the most
    bytes held (parallelize's Trainer with one pipeline rank reads it)."""

    def __init__(self, model):
        self.modules, self.peak, self.saved = model.modules(), 0, None

    def begin(self, runner) -> None:
        self.before = [(m, dict(vars(m))) for m in self.modules]

    def after_loss(self, dy):
        self.saved = assigned_since(self.before)
        self.peak = max(self.peak, nbytes_of([(self.saved.entries, dy)]))
        return dy

    def end_backward(self) -> None:
        if self.saved is not None:
            self.saved.release()
            self.saved = None
