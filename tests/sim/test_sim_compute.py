"""The one compute-charge API (minidist.sim.compute) on a real cluster run.

The device computes 1 FLOP/s and the link's latency is a whole number of seconds, so every clock is an
integer number of seconds held exactly in a float: the rule is asserted with ``==``.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from minidist.cluster import Device, LinkModel, run
from minidist.collectives import allreduce
from minidist.nn import Checkpoint, Linear, MSELoss, ReLU, Sequential
from minidist.nn.runner import Attachment, StepRunner
from minidist.parallel.pipeline.zero_bubble import DeferredWeightGrad
from minidist.sim.compute import ComputeCharges, backward_factor, charge_flops, charge_seconds, wait_until

ONE_FLOP = Device(flops=1.0)
FREE = LinkModel(alpha=0.0, beta=0.0)
SLOW = LinkModel(alpha=1000.0, beta=0.0)        # one message: 1000 s, longer than any backward here
BATCH, WIDTHS = 2, (3, 5, 4)


def linears(seed=0):
    rng = np.random.default_rng(seed)
    return [Linear(a, b, rng=rng, dtype=np.float64) for a, b in zip(WIDTHS[:-1], WIDTHS[1:], strict=True)]


def forward_flops() -> list[int]:
    """F of each Linear of ``linears`` on the batch: 2·N·in·out."""
    return [2 * BATCH * a * b for a, b in zip(WIDTHS[:-1], WIDTHS[1:], strict=True)]


def step(comm, units, charges, extra=()):
    """One forward-backward through the runner; returns the seconds the clock advanced."""
    rng = np.random.default_rng(comm.rank)
    x, y = rng.standard_normal((BATCH, WIDTHS[0])), rng.standard_normal((BATCH, WIDTHS[-1]))
    runner = StepRunner(Sequential(*units), MSELoss(), [*extra, charges], input_grad=True)
    start = comm.clock
    runner.forward_backward(x, y)
    return comm.clock - start


def _rule(comm, kind, overlap):
    first, second = linears()
    units = {"plain": [first, ReLU(), second],
             "checkpoint": [Checkpoint(Sequential(first, ReLU())), second],
             "deferred": [DeferredWeightGrad(first), ReLU(), DeferredWeightGrad(second)]}[kind]
    charges = ComputeCharges(comm, overlap=overlap)
    seconds = step(comm, units, charges)
    return seconds, charges.busy_seconds, list(charges.flops), charges.recomputed


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "serial"])
@pytest.mark.parametrize("kind", ["plain", "checkpoint", "deferred"])
def test_backward_costs_its_factor_times_forward_on_the_clock(kind, overlap):
    f1, f2 = forward_flops()
    relu = BATCH * WIDTHS[1]                          # ReLU: one comparison per element
    forward = f1 + relu + f2
    backward = {"plain": 2 * f1 + 2 * relu + 2 * f2,
                "checkpoint": 3 * (f1 + relu) + 2 * f2,     # the segment's forward again, then 2×
                "deferred": f1 + 2 * relu + f2}[kind]       # a split Linear's B: dx only (W comes later)
    for seconds, busy, flops, recomputed in run(_rule, 2, kind, overlap, device=ONE_FLOP, link=FREE):
        assert seconds == busy == forward + backward
        assert sum(flops) == forward
        assert (recomputed > 0) == (kind == "checkpoint")


def test_backward_factor_names_the_rule():
    first, second = linears()
    assert backward_factor(first) == 2
    assert backward_factor(Checkpoint(Sequential(first))) == 3
    assert backward_factor(DeferredWeightGrad(second)) == 1


class AllreduceAfterLastLayer(Attachment):
    """Starts an allreduce as soon as the last layer's backward is done, at the compute stream's time
    (after_backward fires after the charges' own, as a gradient sync attached before them)."""

    def __init__(self, comm, charges, last):
        self.comm, self.charges, self.last = comm, charges, last

    def after_backward(self, i, layer, dx):
        if i == self.last:
            self.charges.wait_until(self.charges.ready(), "until the gradient is ready")
            self.issued = self.comm.clock
            allreduce(self.comm, np.ones(4))
            self.done = self.comm.clock
        return dx


def _overlap(comm, overlap):
    first, second = linears()
    charges = ComputeCharges(comm, overlap=overlap)
    sync = AllreduceAfterLastLayer(comm, charges, last=2)
    start = comm.clock
    seconds = step(comm, [first, ReLU(), second], charges, extra=[sync])
    return seconds, sync.issued - start, sync.done - start, [(s.label, s.start - start, s.end - start)
                                                             for s in charges.spans]


def test_overlap_hides_the_allreduce_behind_backward_and_serial_does_not():
    f1, f2 = forward_flops()
    relu = BATCH * WIDTHS[1]
    forward, rest = f1 + relu + f2, 2 * relu + 2 * f1        # rest: backward after the last layer's
    overlapped = run(_overlap, 2, True, device=ONE_FLOP, link=SLOW)
    serial = run(_overlap, 2, False, device=ONE_FLOP, link=SLOW)
    for (o_seconds, o_issued, o_done, o_spans), (s_seconds, s_issued, s_done, _) in zip(overlapped, serial,
                                                                                        strict=True):
        allreduce_seconds = o_done - o_issued
        assert allreduce_seconds == s_done - s_issued > rest
        assert o_issued == s_issued == forward + 2 * f2       # both wait for the last layer's backward
        assert s_seconds == forward + 2 * f2 + allreduce_seconds + rest
        assert o_seconds == forward + 2 * f2 + allreduce_seconds   # the rest ran beside the allreduce
        backward = [(start, end) for label, start, end in o_spans if label.startswith("backward")]
        assert backward[-1][1] == forward + 2 * f2 + rest          # the compute stream's own end
        assert [label for label, _, _ in o_spans] == ["forward Linear", "forward ReLU", "forward Linear",
                                                      "backward Linear", "backward ReLU", "backward Linear"]


def _functions(comm):
    start = comm.clock
    charge_flops(comm, 7, "seven FLOPs")
    after_flops = comm.clock - start
    charge_seconds(comm, 2.5, "a step of given length")
    after_seconds = comm.clock - start
    wait_until(comm, comm.clock - 1.0, "in the past: no wait")
    unchanged = comm.clock - start
    wait_until(comm, start + 20.0, "the compute stream ends at start + 20")
    return after_flops, after_seconds, unchanged, comm.clock - start


def test_the_functions_charge_the_clock():
    for result in run(_functions, 1, device=ONE_FLOP, link=FREE):
        assert result == (7.0, 9.5, 9.5, 20.0)


def _bad_amounts(comm):
    start = comm.clock
    with pytest.raises(ValueError, match="flops must be >= 0"):
        charge_flops(comm, -1, "negative")
    with pytest.raises(TypeError, match="flops must be a real number"):
        charge_flops(comm, "12", "a string")
    with pytest.raises(TypeError, match="seconds must be a real number"):
        charge_seconds(comm, True, "a bool")
    with pytest.raises(ValueError, match="seconds must be >= 0"):
        charge_seconds(comm, float("nan"), "not a number")
    with pytest.raises(TypeError, match="overlap must be a bool"):
        ComputeCharges(comm, overlap="yes")
    with pytest.raises(TypeError, match="label must be a str"):
        ComputeCharges(comm, label=3)
    return comm.clock - start


def test_bad_input_is_a_clear_error():
    assert run(_bad_amounts, 1, device=ONE_FLOP, link=FREE) == [0.0]   # nothing was charged
    for bad in (object(), SimpleNamespace(clock=0.0)):
        with pytest.raises(TypeError, match="comm must be a communicator"):
            charge_flops(bad, 1, "not a communicator")
        with pytest.raises(TypeError, match="comm must be a communicator"):
            wait_until(bad, 1.0, "not a communicator")
    with pytest.raises(TypeError, match="comm must be a communicator"):
        ComputeCharges(object())
    without_compute = ComputeCharges(SimpleNamespace(clock=0.0))   # a clock is all the constructor needs
    with pytest.raises(TypeError, match="ComputeCharges: comm must be a communicator"):
        without_compute.charge(1, "at the first charge")
