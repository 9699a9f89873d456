"""The always-on wall-clock counters (minidist.cluster.wall): waiting, sleeps, calls, the run's two ends."""

import time

import numpy as np

from minidist.cluster import Span, run, run_traced


def _late_sender(comm):
    """Rank 1 sends 0.3 s late: rank 0 waits that long inside recv, asleep on its doorbell."""
    before = (comm.wall.in_calls, comm.wall.waiting, comm.wall.sleeps)
    if comm.rank == 1:
        time.sleep(0.3)
        comm.send(np.arange(4.0), dst=0)
    else:
        comm.recv(src=1)
    wall = comm.wall
    return before, (wall.in_calls, wall.waiting, wall.sleeps, wall.messages)


def test_a_late_message_is_counted_as_waiting_and_sleeping():
    (before0, (calls, waiting, sleeps, messages)), (before1, (calls1, waiting1, _, _)) = run(_late_sender, 2)
    assert before0 == (0.0, 0.0, 0)                  # counters start at zero in every rank
    assert 0.25 < waiting <= calls < 5.0             # the receiver's wait is inside its recv call
    assert sleeps >= 1                               # it slept on its doorbell, it did not spin 0.3 s
    assert 0.0 <= messages == calls - waiting < 0.25
    assert waiting1 < 0.25 and calls1 < 0.25         # the late sender never waited: the mailbox had room


def _sleep_then_ring(comm):
    time.sleep(0.2)
    return comm.sendrecv(np.full(3, comm.rank), dst=(comm.rank + 1) % 2, src=(comm.rank + 1) % 2)


def test_run_traced_reports_its_two_ends_and_the_same_spans():
    called = time.monotonic()
    results, trace = run_traced(_sleep_then_ring, 2)
    total = time.monotonic() - called
    assert [r.tolist() for r in results] == [[1, 1, 1], [0, 0, 0]]
    assert 0.0 < trace.startup and 0.0 <= trace.shutdown and trace.startup + trace.shutdown + 0.2 <= total
    assert all(type(s) is Span for s in trace.spans)         # spans travel pickled, come back as Spans
    assert sorted((s.rank, s.kind, s.peer, s.nbytes) for s in trace.spans) == [
        (0, "recv", 1, 24), (0, "send", 1, 24), (1, "recv", 0, 24), (1, "send", 0, 24)]
