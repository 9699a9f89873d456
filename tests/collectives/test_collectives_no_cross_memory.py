"""The shared-memory and ``auto`` allreduce without cross-memory copies (``MINIDIST_CROSS_MEMORY=0``, as on
macOS or in a sandbox that refuses process_vm_readv): every size works, bitwise, at the same cost.

Arrays in the shared block (``shared_empty`` buffers, copies in the area) need no kernel copy, so every
array the area holds goes through it as it does with copies; larger arrays take the ring. One ``run`` per
(P, copies on/off) reduces every size of the matrix — on each side of the one-meeting limit (16 KiB), of a
view chunk (256 KiB) and of the area (1 MiB per rank) — private, from ``shared_empty``, or both in one
call, with ``shared_memory`` and ``auto``: integer data, compared bitwise with the one-process sum; the
stats and the simulated clock of each call the area holds are the same with copies on and off.
"""

import numpy as np
import pytest

from minidist.cluster import cross_memory, run
from minidist.collectives import allreduce, shared_empty
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD
from minidist.parallel.data import DataParallel
from tests.collectives.collectives_data import exact, rank_arrays

AREA = 2**20                       # bytes the shared area of ``run`` takes per rank (layout.py)
SIZES = [1, 2047, 2048, 2049, 8192, 32769, 70000, AREA // 8, AREA // 8 + 1, AREA // 8 + 5000]   # int64
SEED = 58


def _matrix(comm):
    rows = []
    for n in SIZES:
        inputs = rank_arrays(SEED + n, comm.world_size, (n,), np.int64)
        want = exact(inputs, "sum")
        for kind in ("private", "shared", "mixed"):          # mixed: the even ranks' arrays are shared
            x = inputs[comm.rank]
            if kind == "shared" or kind == "mixed" and comm.rank % 2 == 0:
                x = shared_empty(comm, (n,), np.int64)
                assert comm.shared_area().buffers.holds(x)
                x[...] = inputs[comm.rank]
            for algorithm in ("shared_memory", "auto"):
                before, clock = vars(comm.stats).copy(), comm.clock
                got = allreduce(comm, x, algorithm=algorithm)
                after = vars(comm.stats)
                cost = tuple(after[key] - before.get(key, 0) for key in sorted(after))
                rows.append(((n, kind, algorithm), got.tobytes() == want.tobytes(), cost, comm.clock - clock))
    return rows


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_size_reduces_bitwise_with_and_without_cross_memory_copies(world_size, monkeypatch):
    results = {}
    for copies in ("1", "0") if cross_memory.available() else ("0",):
        monkeypatch.setenv("MINIDIST_CROSS_MEMORY", copies)
        results[copies] = run(_matrix, world_size)
    for copies, ranks in results.items():
        for rank, rows in enumerate(ranks):
            for case, bitwise, _, _ in rows:
                assert bitwise, (copies, rank, case)
    if "1" in results:      # what the area holds goes the same way: the stats and the clock see no copies
        for on, off in zip(results["1"], results["0"], strict=True):
            for (case, _, cost_on, clock_on), (_, _, cost_off, clock_off) in zip(on, off, strict=True):
                if case[0] * 8 > AREA:          # (larger: windows with copies, the ring without)
                    continue
                assert cost_on == cost_off, case
                assert clock_on == clock_off, case


def _model():
    rng = np.random.default_rng(0)
    return Sequential(Linear(32, 128, rng=rng, dtype=np.float64), ReLU(),
                      Linear(128, 32, rng=rng, dtype=np.float64))                # 8,352 float64: 67 KB


_data = np.random.default_rng(1)
BATCHES = [(_data.normal(size=(6, 32)), _data.integers(0, 32, size=6)) for _ in range(2)]


def _train(comm):
    model = _model()
    dp = DataParallel(comm, model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), algorithm="auto")
    for x, y in BATCHES:               # the global batch: each rank trains on its shard
        dp.zero_grad()
        dp.forward_backward(x, y)
        dp.step()
    return [p.data.copy() for p in model.parameters()]


def test_data_parallel_auto_trains_without_cross_memory_copies(monkeypatch):
    monkeypatch.setenv("MINIDIST_CROSS_MEMORY", "0")
    replicas = run(_train, 3)
    model, loss_fn = _model(), CrossEntropyLoss()
    opt = SGD(model.parameters(), lr=0.1)
    for x, y in BATCHES:               # one process, the full batch
        opt.zero_grad()
        loss_fn.forward(model.forward(x), y)
        model.backward(loss_fn.backward())
        opt.step()
    for other in replicas:
        assert [a.tobytes() for a in other] == [a.tobytes() for a in replicas[0]]
        for got, want in zip(other, [p.data for p in model.parameters()], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)
