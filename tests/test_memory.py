"""The memory ledger measures the arrays actually held: parameters, gradients, optimizer state, saved
activations (checkpointing shrinks them), buffers; views count once; peak, timeline, Chrome counters."""

import json

import numpy as np
import pytest

from minidist.cluster import run_traced
from minidist.nn import Checkpoint, CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD, Adam
from minidist.sim.memory import CATEGORIES, MODEL_STATES, MemoryLedger, held_bytes, record, save_chrome


def _mlp(checkpoint=False, dtype=np.float32):
    rng = np.random.default_rng(0)
    body = Sequential(
        Linear(10, 32, rng=rng, dtype=dtype), ReLU(), Linear(32, 32, rng=rng, dtype=dtype), ReLU()
    )
    return Sequential(Checkpoint(body) if checkpoint else body, Linear(32, 4, rng=rng, dtype=dtype))


def test_memory_held_bytes_counts_parameters_gradients_and_optimizer_state():
    model = _mlp()
    psi = model.num_parameters()
    for make, k in ((lambda ps: SGD(ps, lr=0.1), 0), (lambda ps: SGD(ps, lr=0.1, momentum=0.9), 1),
                    (lambda ps: Adam(ps), 2)):
        opt = make(model.parameters())
        held = held_bytes(model, opt)
        assert held["parameters"] == held["gradients"] == 4 * psi
        opt.step()
        assert held_bytes(model, opt)["optimizer"] == k * 4 * psi


def test_memory_activations_are_the_saved_arrays_and_checkpointing_shrinks_them():
    x, y = np.random.default_rng(1).normal(size=(16, 10)).astype(np.float32), np.arange(16) % 4
    plain, ckpt = _mlp(), _mlp(checkpoint=True)
    assert held_bytes(plain)["activations"] == 0
    for model in (plain, ckpt):
        CrossEntropyLoss().forward(model.forward(x), y)
    # plain: x (16·10·4), ReLU masks (2·16·32·1 byte), the two hidden outputs the Linears keep (2·16·32·4)
    assert held_bytes(plain)["activations"] == 16 * 10 * 4 + 2 * 16 * 32 + 2 * 16 * 32 * 4
    # checkpointed: the segment keeps only its input x; the last Linear its input (16·32·4)
    assert held_bytes(ckpt)["activations"] == 16 * 10 * 4 + 16 * 32 * 4


def test_memory_views_count_once_in_the_first_category_that_claims_them():
    model = _mlp(dtype=np.float64)
    flat = np.zeros(model.num_parameters())
    offset = 0
    for p in model.parameters():
        p.grad = flat[offset:offset + p.size].reshape(p.shape)
        offset += p.size
    held = held_bytes(model, buffers=[flat, flat[:5], None])
    assert held["gradients"] == flat.nbytes and held["buffers"] == 0


def test_memory_ledger_peak_timeline_and_chrome_counters(tmp_path):
    ledger = MemoryLedger(rank=1)
    ledger.record("a", {"parameters": 10, "gradients": 5})
    ledger.record("b", {"parameters": 10, "activations": 30}, time=2.0)
    ledger.record("c", {"parameters": 10})
    assert ledger.peak() == 40 and ledger.peak("gradients") == 5 and ledger.peak_point()[1] == "b"
    assert [t for t, _, _ in ledger.timeline] == [0.0, 2.0, 2.0 + 1e-6] and ledger.total() == 10
    events = ledger.chrome_events()
    assert events[1] == {"name": "memory rank 1", "ph": "C", "pid": 0, "tid": 1, "ts": 2e6,
                         "args": {c: {"parameters": 10, "activations": 30}.get(c, 0) for c in CATEGORIES}}
    with pytest.raises(ValueError, match="unknown memory categories"):
        ledger.record("d", {"weights": 1})
    with pytest.raises(ValueError, match="category must be one of"):
        ledger.peak("weights")
    with pytest.raises(ValueError, match="rank"):
        MemoryLedger(-1)
    assert record(None, "nothing") is None


def _traced(comm):
    ledger = MemoryLedger(comm.rank)
    model = _mlp()
    record(ledger, "start", model, time=comm.clock)
    comm.compute(1e9)
    record(ledger, "later", model, time=comm.clock)
    return ledger


def test_memory_counters_merge_with_the_cluster_trace(tmp_path):
    ledgers, trace = run_traced(_traced, 2)
    path = save_chrome(tmp_path / "t.json", trace.chrome_events(), *(l.chrome_events() for l in ledgers))
    events = json.loads(path.read_text())["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    assert len(counters) == 4 and {e["tid"] for e in counters} == {0, 1}
    assert max(e["ts"] for e in counters) == pytest.approx(trace.clocks[0] * 1e6)


def test_memory_extra_arrays_and_peaks_of_several_categories():
    model = _mlp()
    master = np.zeros(100, dtype=np.float32)
    held = held_bytes(model, extra={"optimizer": [master, master[:10]], "gradients": [None]})
    assert held["optimizer"] == 400 and held["gradients"] == 4 * model.num_parameters()
    with pytest.raises(ValueError, match="unknown memory category"):
        held_bytes(model, extra={"masters": [master]})
    ledger = MemoryLedger()
    ledger.record("a", {"parameters": 10, "gradients": 5, "activations": 50})
    ledger.record("b", {"parameters": 10, "gradients": 20, "optimizer": 1})
    assert ledger.peak(MODEL_STATES) == 31 and ledger.peak(("activations",)) == 50 and ledger.peak() == 65
    with pytest.raises(ValueError, match="category must be one of"):
        ledger.peak(())


@pytest.mark.parametrize("held, time, error", [
    ({"parameters": -1}, 1.0, ValueError), ({"parameters": 5.7}, 1.0, ValueError),
    ({"parameters": True}, 1.0, ValueError), ({"buffers": 3}, float("nan"), ValueError),
    ({"buffers": 3}, 0.5, ValueError), ({"buffers": 3}, "2", TypeError),
])
def test_memory_ledger_refuses_bad_points_and_keeps_its_timeline(held, time, error):
    ledger = MemoryLedger()
    with pytest.raises(ValueError, match="empty"):
        ledger.total()
    ledger.record("first", {"parameters": 8}, time=1.0)
    with pytest.raises(error, match="held bytes|time"):
        ledger.record("bad", held, time=time)
    assert ledger.timeline == [(1.0, "first", {c: 8 * (c == "parameters") for c in CATEGORIES})]
    ledger.record("same time is fine", {"parameters": np.int64(8)}, time=1.0)
    assert ledger.total() == 8 and isinstance(ledger.timeline[-1][2]["parameters"], int)
