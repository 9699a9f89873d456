"""The compute stream on the simulated clock: a step-runner attachment every strategy can use.

A layer's forward costs its FLOPs / the device's FLOP rate (``layer.flops(input_shape)``; layers without
``flops`` cost nothing); its backward twice that (dx and dW are one product each). A GPU runs kernels and
collectives on two streams at once; one rank here is one process, so:

    overlap=True   the compute stream is a number ``t`` that backward advances, and ``comm.clock`` is the
                   communication stream: a collective issued at ``ready()`` first waits until t, and at
                   the end of backward the clock waits for whichever stream finished last;
    overlap=False  backward's time is charged to comm.clock at once, so collectives run after it.

Every charge is also a ``Span`` in ``spans`` (minidist.plots.plot_overlap draws them).
"""

from __future__ import annotations

from minidist.cluster import Span
from minidist.nn.runner import Attachment


class ComputeClock(Attachment):
    """Charges each layer's forward and backward to ``comm``'s simulated clock (see the module docstring)."""

    def __init__(self, comm, overlap: bool = True):
        self.comm, self.overlap = comm, bool(overlap)
        self.spans: list[Span] = []
        self.times: dict[int, float] = {}     # forward seconds of each layer of the last forward
        self.t = comm.clock                   # the compute stream

    def before_forward(self, i, layer, x):
        flops = layer.flops(x.shape) if callable(getattr(layer, "flops", None)) else 0
        start = self.comm.clock
        self.comm.compute(flops, label=f"forward {type(layer).__name__}")
        self.spans.append(Span(self.comm.rank, start, self.comm.clock, "compute",
                               f"forward {type(layer).__name__}"))
        self.times[i], self.t = self.comm.clock - start, self.comm.clock
        return x

    def after_backward(self, i, layer, dx):
        start, self.t = self.t, self.t + 2 * self.times[i]
        self.spans.append(Span(self.comm.rank, start, self.t, "compute", f"backward {type(layer).__name__}"))
        if not self.overlap:
            self.comm.elapse(self.t - start, label=f"backward {type(layer).__name__}")
        return dx

    def ready(self) -> float:
        """Simulated time at which the gradients produced so far exist (the compute stream's now)."""
        return self.t

    def wait_until(self, t: float, label: str) -> None:
        """The communication stream waits until time t (a collective needs what the compute stream made)."""
        if self.comm.clock < t:
            self.comm.elapse(t - self.comm.clock, label=label)

    def end_backward(self) -> None:
        self.wait_until(self.t, "backward")

