"""The simulated clock follows the alpha-beta model exactly; traces export one track per rank."""

import json

import matplotlib
import numpy as np
import pytest

from minidist.cluster import Device, LinkModel, Span, run, run_traced
from minidist.sim.plots import plot_timeline

# Powers of two: every time below is exact in floating point, so we can compare with ==.
ALPHA, BETA, FLOPS = 2.0**-10, 2.0**-20, 2.0**30


def scripted(comm):
    if comm.rank == 0:
        comm.compute(2**21, label="forward")                  # 2^21 / 2^30 = 2^-9 s
        comm.send(np.zeros(1024, np.uint8), 1)                 # alpha + 1024 beta = 2^-10 + 2^-10
        comm.recv(1)
    else:
        comm.elapse(2.0**-11, label="idle work")
        comm.recv(0)
        comm.send(np.zeros(256, np.float64), 0)                # 2048 bytes: 2^-10 + 2^-9
    return comm.clock


def scripted_then_dropped(comm):
    clock = scripted(comm)
    comm.drop_spans()                                          # only what follows travels back
    comm.elapse(2.0**-12, label="after the drop")
    return clock, comm.clock


def test_dropped_spans_do_not_come_back_and_the_clock_runs_on():
    link, device = LinkModel(ALPHA, BETA), Device(flops=FLOPS)
    results, trace = run_traced(scripted_then_dropped, 2, link=link, device=device)
    for rank, (before, after) in enumerate(results):
        assert after == before + 2.0**-12 == trace.clocks[rank]
        assert trace.rank_spans(rank) == [Span(rank, before, after, "compute", "after the drop")]


def test_scripted_exchange_gives_the_exact_alpha_beta_times():
    link, device = LinkModel(ALPHA, BETA), Device(flops=FLOPS)
    clocks, trace = run_traced(scripted, 2, link=link, device=device)
    c = 2.0**-9
    arrive0 = c + ALPHA + 1024 * BETA                          # rank 0's message reaches rank 1
    arrive1 = arrive0 + ALPHA + 2048 * BETA                    # rank 1 answers after receiving it
    assert clocks == [arrive1, arrive1] == trace.clocks
    assert trace.rank_spans(0) == [Span(0, 0.0, c, "compute", "forward"),
                                   Span(0, c, arrive0, "send", "send 1.0 KiB to 1", 1, 1024),
                                   Span(0, arrive0, arrive1, "recv", "recv 2.0 KiB from 1", 1, 2048)]
    assert trace.rank_spans(1) == [Span(1, 0.0, 2.0**-11, "compute", "idle work"),
                                   Span(1, 2.0**-11, arrive0, "recv", "recv 1.0 KiB from 0", 0, 1024),
                                   Span(1, arrive0, arrive1, "send", "send 2.0 KiB to 0", 0, 2048)]
    assert [s.bytes_sent for s in trace.stats] == [1024, 2048]


def _spans_kept(comm):
    clocks_and_stats = scripted(comm), comm.stats
    return clocks_and_stats, len(comm._ledger.spans)


def test_run_keeps_no_spans_but_the_same_clock_and_stats():
    """Spans are stored only under run_traced; plain run charges the clock and the counters the same."""
    link, device = LinkModel(ALPHA, BETA), Device(flops=FLOPS)
    plain = run(_spans_kept, 2, link=link, device=device)
    traced, trace = run_traced(_spans_kept, 2, link=link, device=device)
    assert [result for result, _ in plain] == [result for result, _ in traced]
    assert [count for _, count in plain] == [0, 0]
    assert [count for _, count in traced] == [3, 3] == [len(trace.rank_spans(r)) for r in range(2)]


@pytest.mark.parametrize("world_size", [2, 5])
def test_ring_of_sendrecv_costs_one_message_per_step_and_barrier_aligns_clocks(world_size):
    n = 4096

    def fn(comm):
        right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
        x = np.zeros(n // 8)
        for _ in range(comm.world_size - 1):
            x = comm.sendrecv(x, right, left)
        after_ring = comm.clock
        comm.elapse(comm.rank * 1e-3)
        comm.barrier()
        return after_ring, comm.clock

    results = run(fn, world_size, link=LinkModel(ALPHA, BETA))
    for after_ring, after_barrier in results:
        assert after_ring == (world_size - 1) * (ALPHA + n * BETA)
        assert after_barrier == results[-1][0] + (world_size - 1) * 1e-3


def test_chrome_trace_has_one_track_per_rank(tmp_path):
    def fn(comm):
        comm.compute(1e9, "matmul")
        comm.sendrecv(np.ones(100), (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size)

    _, trace = run_traced(fn, 3)
    path = trace.save_chrome(tmp_path / "trace.json")
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2"}
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["tid"] for e in spans} == {0, 1, 2}
    assert sorted(e["cat"] for e in spans if e["tid"] == 1) == ["compute", "recv", "send"]
    assert all(e["dur"] >= 0 for e in spans)

    matplotlib.use("Agg")
    ax = plot_timeline(trace, path=tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 0 and len(ax.patches) >= 9


def test_verbose_mode_prints_each_message(capfd, monkeypatch):
    monkeypatch.setenv("MINIDIST_VERBOSE", "1")

    def fn(comm):
        if comm.rank == 2:
            comm.send(np.zeros(1024, np.float32), 3)
        elif comm.rank == 3:
            comm.recv(2)

    run(fn, 4)
    out = capfd.readouterr().out
    assert "rank 2 -> 3  tag 0  4.0 KiB  step 1" in out
    assert "rank 3 <- 2  tag 0  4.0 KiB  step 1" in out


def test_bad_machine_specs():
    with pytest.raises(ValueError, match="alpha"):
        LinkModel(alpha=-1.0)
    with pytest.raises(ValueError, match="flops"):
        Device(flops=0)
