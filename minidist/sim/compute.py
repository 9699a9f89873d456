"""Compute on the simulated clock: the one place where work (not messages) advances a rank's clock.

The rule. A unit's forward costs its FLOPs, F = ``unit.flops(input_shape)`` (a unit without ``flops``
costs nothing), at the device's rate R: F / R seconds. Its backward costs m × that, where

    m = 2        dx and dW are one matrix product each, as large as the forward's
    m = 2 + 1    a ``Checkpoint`` first runs its segment's forward again (recomputation)
    m = 1        a unit whose weight gradient is deferred (``backward_factor = 1``: the zero-bubble
                 pipeline's B; its W is charged with ``charge`` when it runs)

A GPU runs kernels and collectives on two streams at once; one rank here is one process, so:

    overlap=True   the compute stream is a number ``t`` that backward advances (t += m · forward seconds)
                   and ``comm.clock`` is the communication stream: a collective issued at ``ready()``
                   first waits until t (``wait_until``), and at the end of backward the clock waits for
                   whichever stream finished last;
    overlap=False  backward's m · F FLOPs are charged to comm.clock at once: collectives run after them.

``streamed_forward = True`` (an attribute; overlap=True only) puts the forward on the compute stream too,
from where the last step's streams ended (``begin``): a collective issued at ``begin`` then overlaps the
forward (parallel.data.delayed: the delayed update). Only for a model whose forward sends nothing.

``ComputeCharges`` is the step runner's attachment that applies the rule to every unit; every charge is
also a ``Span`` in ``spans`` (minidist.sim.plots.plot_overlap draws them) and counts in ``busy_seconds``.
Work that is not a runner unit (a layer charging between its own messages, a worker's step of given
duration, ring attention's block beside its message) is charged with the functions ``charge_flops``,
``charge_seconds`` and ``wait_until``. No strategy calls the communicator's compute/elapse itself.
"""

from __future__ import annotations

import numbers

from minidist.cluster import Span
from minidist.nn.checkpoint import Checkpoint
from minidist.nn.runner import Attachment

__all__ = ["ComputeCharges", "backward_factor", "charge_flops", "charge_seconds", "wait_until"]


def _check_comm(comm, what: str, methods=("compute", "elapse")) -> None:
    if not isinstance(getattr(comm, "clock", None), numbers.Real) or \
            not all(callable(getattr(comm, name, None)) for name in methods):
        raise TypeError(f"{what}: comm must be a communicator (its clock, {', '.join(methods)}), "
                        f"got {type(comm).__name__}")


def _check_amount(value, name: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what}: {name} must be a real number, got {type(value).__name__}")
    if not value >= 0:
        raise ValueError(f"{what}: {name} must be >= 0, got {value}")
    return value


def charge_flops(comm, flops, label: str) -> None:
    """Charge ``flops`` (a real number >= 0) of compute now: comm.clock advances by flops / R."""
    _check_comm(comm, "charge_flops")
    comm.compute(_check_amount(flops, "flops", "charge_flops"), label=label)


def charge_seconds(comm, seconds, label: str) -> None:
    """Charge ``seconds`` (a real number >= 0) of compute now (a duration given, not priced in FLOPs)."""
    _check_comm(comm, "charge_seconds")
    comm.elapse(float(_check_amount(seconds, "seconds", "charge_seconds")), label=label)


def wait_until(comm, t: float, label: str) -> None:
    """The clock waits until time t (the compute stream that ends at t finished last); no-op if it is
    past t. Overlapped work of s seconds started at ``start``: send/receive, then wait_until(start + s)."""
    _check_comm(comm, "wait_until")
    if comm.clock < t:
        comm.elapse(t - comm.clock, label=label)


def backward_factor(unit) -> int:
    """m of the rule: the unit's ``backward_factor`` (default 2), + 1 if it is a Checkpoint."""
    return getattr(unit, "backward_factor", 2) + (1 if isinstance(unit, Checkpoint) else 0)


class ComputeCharges(Attachment):
    """Charges each unit's forward and backward to ``comm``'s simulated clock (see the module docstring).

    comm: the rank's communicator. overlap: see the module docstring. after: charge every unit's forward
    once it has run (a pipeline stage: layers that send inside their forward send first) instead of
    before it runs (a Checkpoint is always charged after: it knows its FLOPs only then). label: the label
    of every charge (None: "forward Linear", "backward Linear", ... per unit).

    After a forward, ``flops[i]`` and ``seconds[i]`` hold unit i's forward FLOPs and seconds (a pipeline
    keeps ``flops`` per micro-batch and puts it back before that micro-batch's backward); ``recomputed``
    is the largest activation (bytes) a Checkpoint's recomputation held; ``busy_seconds`` the seconds
    charged so far; ``t`` the compute stream's time.
    """

    def __init__(self, comm, overlap: bool = True, *, after: bool = False, label: str | None = None):
        _check_comm(comm, "ComputeCharges", methods=())      # the charges check the rest when they charge
        for name, value in (("overlap", overlap), ("after", after)):
            if not isinstance(value, bool):
                raise TypeError(f"ComputeCharges: {name} must be a bool, got {type(value).__name__}")
        if label is not None and not isinstance(label, str):
            raise TypeError(f"ComputeCharges: label must be a str or None, got {type(label).__name__}")
        self.comm, self.overlap, self.after, self.label = comm, overlap, after, label
        self.spans: list[Span] = []
        self.flops: list[int] = []
        self.seconds: list[float] = []
        self.recomputed, self.busy_seconds = 0, 0.0
        self.t = comm.clock                   # the compute stream
        self.streamed_forward = False         # see the module docstring
        self._shape: tuple[int, ...] = ()
        self._comm_checked = False            # compute/elapse: checked at the first charge (_checked_comm)

    def _checked_comm(self):
        """The communicator, its compute/elapse checked once, at the first charge (not at every charge:
        a step charges every unit)."""
        if not self._comm_checked:
            _check_comm(self.comm, "ComputeCharges")
            self._comm_checked = True
        return self.comm

    def _label(self, kind: str, unit) -> str:
        return f"{kind} {type(unit).__name__}" if self.label is None else self.label

    def charge(self, flops, label: str) -> float:
        """Charge flops to the clock now (both streams); returns the seconds it took."""
        start = self.comm.clock
        self._checked_comm().compute(_check_amount(flops, "flops", "charge_flops"), label=label)
        self.t = self.comm.clock
        self.spans.append(Span(self.comm.rank, start, self.t, "compute", label))
        self.busy_seconds += self.t - start
        return self.t - start

    def begin(self, runner) -> None:
        if self.streamed_forward:             # the compute stream starts where both streams last ended
            self.t = max(self.t, self.comm.clock)

    def _forward(self, i: int, unit, shape) -> None:
        if i == 0:                            # a new forward: new lists (a pipeline keeps the old ones)
            self.flops, self.seconds = [], []
        flops = unit.flops(tuple(shape)) if callable(getattr(unit, "flops", None)) else 0
        self.flops.append(flops)
        if self.streamed_forward and self.overlap:
            self.seconds.append(self._stream(flops / self.comm.device.flops, self._label("forward", unit)))
        else:
            self.seconds.append(self.charge(flops, self._label("forward", unit)))

    def _charged_after(self, unit) -> bool:
        return self.after or isinstance(unit, Checkpoint)   # a Checkpoint knows its FLOPs once it ran

    def before_forward(self, i, unit, x):
        self._shape = x.shape
        if not self._charged_after(unit):
            self._forward(i, unit, x.shape)
        return x

    def after_forward(self, i, unit, y):
        if self._charged_after(unit):
            self._forward(i, unit, self._shape)
        return y

    def after_backward(self, i, unit, dx):
        m, label = backward_factor(unit), self._label("backward", unit)
        self.recomputed = max(self.recomputed, getattr(unit, "recompute_nbytes", 0))
        if not self.overlap:
            self.charge(m * self.flops[i], label)
            return dx
        self._stream(m * self.seconds[i], label)
        return dx

    def _stream(self, seconds: float, label: str) -> float:
        """seconds of work on the compute stream only (comm.clock, the communication stream, stays)."""
        start, self.t = self.t, self.t + seconds
        self.spans.append(Span(self.comm.rank, start, self.t, "compute", label))
        self.busy_seconds += self.t - start
        return seconds

    def ready(self) -> float:
        """Simulated time at which the gradients produced so far exist (the compute stream's now)."""
        return self.t

    def wait_until(self, t: float, label: str) -> None:
        """The communication stream waits until time t (a collective needs what the compute stream made)."""
        comm = self._checked_comm()
        if comm.clock < t:
            comm.elapse(t - comm.clock, label=label)

    def end_backward(self) -> None:
        self.wait_until(self.t, "backward")
