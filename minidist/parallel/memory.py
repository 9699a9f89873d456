"""The memory ledger as a step-runner attachment: held bytes recorded at the runner's events.

A strategy says *what* a rank holds (``held()``, {category: bytes} as minidist.memory.held_bytes measures
it) and *at which layers* a point is worth recording; the recorder records, the same way for every
strategy (DataParallel, ZeRO, FSDP):

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

from collections.abc import Callable

from minidist.nn.runner import Attachment


class MemoryRecorder(Attachment):
    """Appends ``held()`` to ``ledger`` (a minidist.memory.MemoryLedger or None) at the points above.

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
