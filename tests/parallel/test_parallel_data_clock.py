"""The ledger and the simulated clock of data-parallel steps.

* bytes sent per step = the allreduce formula (minidist.sim.collective_cost) for every bucket, summed;
* the simulated step time of a tiny scripted model equals the schedule computed here by hand:
  forward, backward at 2x forward per layer, each bucket's ring allreduce starting when its last gradient
  is ready and the previous bucket is done.
"""

import numpy as np
import pytest

from minidist.cluster import Device, LinkModel, run, run_traced
from minidist.nn import CrossEntropyLoss, Linear, Sequential
from minidist.optim import SGD
from minidist.parallel.data import DataParallel
from minidist.parallel.data.overlap import step_time
from minidist.sim.collective_cost import allreduce_cost, collective_seconds

DEVICE = Device(flops=1e6)                   # 1 MFLOP/s: a layer of 128 FLOPs takes 128 us
SLOW_LINK = LinkModel(alpha=1e-3, beta=1e-6)  # communication dominates
FAST_LINK = LinkModel(alpha=1e-5, beta=1e-8)  # communication hides behind the backward pass


def _bytes_per_step(comm, algorithms, bucket_bytes):
    rng = np.random.default_rng(0)
    # 8*8 + 8 + 8*4 + 4 = 108 parameters
    model = Sequential(Linear(8, 8, rng=rng, dtype=np.float64), Linear(8, 4, rng=rng, dtype=np.float64))
    x, y = rng.normal(size=(12, 8)), rng.integers(0, 4, size=12)
    out = {}
    for algorithm in algorithms:
        dp = DataParallel(comm, model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(),
                          algorithm=algorithm, bucket_bytes=bucket_bytes)
        before = comm.stats.bytes_sent, comm.stats.messages_sent
        for _ in range(3):
            dp.train_step(x, y)
        out[algorithm] = ((comm.stats.bytes_sent - before[0]) / 3, [b.nbytes for b in dp.buckets])
    return out


@pytest.mark.exercise("dp_bucketed_allreduce")
@pytest.mark.parametrize("world_size", [2, 4])
def test_parallel_data_ledger_bytes_per_step_equal_the_formula(world_size):
    algorithms = ["ring", "naive", "parameter_server", "tree", "recursive_doubling", "rabenseifner"]
    model_bytes = 108 * 8
    per_rank = run(_bytes_per_step, world_size, algorithms, 10**6, timeout=60)   # one bucket: the model
    for rank, result in enumerate(per_rank):
        for algorithm in algorithms:
            sent, buckets = result[algorithm]
            assert buckets == [model_bytes]
            formula = allreduce_cost(algorithm, world_size, model_bytes, 0.0, 0.0).bytes_sent[rank]
            assert sent == formula, (algorithm, rank, sent, formula)
    # the seed's 2(P-1)/P |W|
    assert per_rank[0]["ring"][0] == 2 * (world_size - 1) / world_size * model_bytes
    # buckets of 64 + 32 weights and 8 + 4 biases (all divisible by P): the formula per bucket, summed
    per_rank = run(_bytes_per_step, world_size, ["ring"], 100, timeout=60)
    sent, buckets = per_rank[0]["ring"]
    assert buckets == [4 * 8 + 32 * 8, 8 * 8 + 64 * 8]
    assert sent == sum(allreduce_cost("ring", world_size, b, 0.0, 0.0).bytes_sent[0] for b in buckets)


def _scripted_step(comm, bucket_bytes, overlap):
    rng = np.random.default_rng(1)
    model = Sequential(Linear(4, 8, rng=rng, dtype=np.float64), Linear(8, 4, rng=rng, dtype=np.float64))
    dp = DataParallel(comm, model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), algorithm="ring",
                      bucket_bytes=bucket_bytes, overlap=overlap)
    x, y = rng.normal(size=(4, 4)), rng.integers(0, 4, size=4)
    start = comm.clock
    dp.train_step(x, y)
    return comm.clock - start


@pytest.mark.exercise("dp_bucketed_allreduce")
def test_parallel_data_step_time_equals_the_hand_computed_schedule():
    # P = 2, batch 4: 2 examples per rank. Linear(4, 8) and Linear(8, 4): 2*2*4*8 = 128 FLOPs each
    # forward = 128 us per layer; backward 256 us per layer.
    fwd = 128e-6

    def ring(elements, link):       # P = 2: two messages of half the bucket each
        return 2 * (link.alpha + elements / 2 * 8 * link.beta)

    for link in (SLOW_LINK, FAST_LINK):
        got = {}
        for bucket_bytes, overlap in ((200, True), (200, False), (None, True), (10**6, True)):
            times = run(_scripted_step, 2, bucket_bytes, overlap, link=link, device=DEVICE, timeout=60)
            assert times[0] == pytest.approx(times[1], rel=1e-12)
            got[bucket_bytes, overlap] = times[0]
        layer2_done, layer1_done = 2 * fwd + 2 * fwd, 2 * fwd + 4 * fwd   # backward of layer 2, then 1
        # bucket_bytes=200: [b2 (4), W2 (32)] = 288 B ready after layer 2; [b1 (8), W1 (32)] after layer 1
        bucket0_end = layer2_done + ring(36, link)
        want = max(layer1_done, max(bucket0_end, layer1_done) + ring(40, link))
        assert got[200, True] == pytest.approx(want, rel=1e-12)
        # no overlap: both buckets wait for the end of backward
        assert got[200, False] == pytest.approx(layer1_done + ring(36, link) + ring(40, link), rel=1e-12)
        # one allreduce per parameter: b2, W2 ready after layer 2; b1, W1 after layer 1
        t = layer2_done
        for elements, ready in ((4, layer2_done), (32, layer2_done), (8, layer1_done), (32, layer1_done)):
            t = max(t, ready) + ring(elements, link)
        assert got[None, True] == pytest.approx(max(t, layer1_done), rel=1e-12)
        # one bucket for the whole model: nothing to overlap
        assert got[10**6, True] == pytest.approx(layer1_done + ring(76, link), rel=1e-12)
        # the closed form in minidist.parallel.data.overlap agrees
        model = step_time([fwd, fwd], [1, 0], [collective_seconds("ring", 2, n, 8, link) for n in (36, 40)])
        assert got[200, True] == pytest.approx(model, rel=1e-12)
    # with the slow link communication is exposed; with the fast one it hides behind the backward pass
    assert got[200, True] < got[200, False]


def _timeline(comm):
    rng = np.random.default_rng(1)
    model = Sequential(Linear(4, 8, rng=rng, dtype=np.float64), Linear(8, 4, rng=rng, dtype=np.float64))
    dp = DataParallel(comm, model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), bucket_bytes=200)
    dp.train_step(rng.normal(size=(4, 4)), rng.integers(0, 4, size=4))
    return dp.clock.spans


@pytest.mark.exercise("dp_bucketed_allreduce")
def test_parallel_data_timeline_files(tmp_path):
    from minidist.parallel.data.overlap import save_overlap_chrome
    from minidist.sim.plots import plot_overlap

    spans, trace = run_traced(_timeline, 2, link=SLOW_LINK, device=DEVICE, timeout=60)
    assert [s.label for s in spans[0]] == ["forward Linear"] * 2 + ["backward Linear"] * 2
    assert spans[0][-1].end - spans[0][0].start == pytest.approx(6 * 128e-6, rel=1e-12)
    plot_overlap(trace, spans, path=tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 5000
    import json

    events = json.loads(save_overlap_chrome(trace, spans, tmp_path / "t.json").read_text())["traceEvents"]
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} == {
        "rank 0 compute", "rank 0 comm", "rank 1 compute", "rank 1 comm"}
    # per rank: 2 allgathers of the start-up check (1 send each at P = 2) + 2 buckets x 2 ring steps
    assert sum(e["ph"] == "X" and e["cat"] == "send" for e in events) == 2 * (2 + 2 * 2)
