"""allreduce through windows (``algorithm="shared_memory"`` on arrays that the area does not hold, and on
shared buffers of any size): every rank's own array, read and written in place by the others.

hypothesis draws the world size (2-6), a length on either side of the area's size (1 MiB per rank),
dtype, op, and for each rank whether its array is private or a shared buffer (``shared_empty``), so that
ranks that mix the two meet in one window. Integer values: results compare bitwise with the exact
reduction. Random floats check the documented order of the sum: rank order, the same bits everywhere.
"""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.cluster import cross_memory, run
from minidist.collectives import allreduce, choose_algorithm, shared_empty
from minidist.collectives.shared_memory import WINDOW_MIN_BYTES, has_windows
from tests.collectives.collectives_data import exact, rank_arrays

AREA = 2**20                       # bytes the shared area of ``run`` takes per rank (layout.py)
windows_here = pytest.mark.skipif(not cross_memory.available(), reason="no process_vm_readv/writev here")


def _reduce(comm, seed, n, dtype, op, shared_ranks):
    x = rank_arrays(seed, comm.world_size, (n,), dtype)[comm.rank]
    if comm.rank in shared_ranks:
        buffer = shared_empty(comm, (n,), dtype)
        assert comm.shared_area().buffers.holds(buffer)
        buffer[...] = x
        x = buffer
    meetings = comm.shared_area().meetings
    copy = allreduce(comm, x, op=op, algorithm="shared_memory")
    untouched = x.tobytes() == rank_arrays(seed, comm.world_size, (n,), dtype)[comm.rank].tobytes()
    allreduce(comm, x, op=op, algorithm="shared_memory", out=x)
    return copy, x.copy(), untouched, comm.shared_area().meetings - meetings


@windows_here
@pytest.mark.slow
@settings(max_examples=12)
@given(world_size=st.integers(2, 6), seed=st.integers(0, 2**32 - 1),
       extra=st.one_of(st.integers(1, 3000), st.integers(-AREA // 8, -4100 // 4)),
       dtype=st.sampled_from([np.float32, np.int64]), op=st.sampled_from(["sum", "max", "min"]),
       shared=st.lists(st.booleans(), min_size=6, max_size=6))
def test_windows_give_the_exact_reduction_on_every_rank(world_size, seed, extra, dtype, op, shared):
    n = AREA // 4 + extra        # just above the area (private arrays: windows), or well inside it
    shared_ranks = [r for r in range(world_size) if shared[r]]
    want = exact(rank_arrays(seed, world_size, (n,), dtype), op)
    for rank, (copy, in_place, untouched, meetings) in enumerate(run(_reduce, world_size, seed, n, dtype, op,
                                                                     shared_ranks)):
        for got in (copy, in_place):
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (rank, n, dtype, op)
        assert untouched                            # without out=, the input stays as it was
        assert meetings == 4                        # two meetings per call: no message went by the ring


def _rank_order(comm, n, shared):
    x = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
    if shared:
        buffer = shared_empty(comm, (n,), np.float32)
        buffer[...] = x
        x = buffer
    return allreduce(comm, x, algorithm="shared_memory", out=x).copy()


@windows_here
@pytest.mark.parametrize("world_size, n, shared", [(2, 300_000, False), (4, 300_001, False), (3, 5000, True),
                                                    (5, 300_003, True)])
def test_the_sum_is_taken_in_rank_order_bitwise_the_same_everywhere(world_size, n, shared):
    arrays = [np.random.default_rng(r).standard_normal(n).astype(np.float32) for r in range(world_size)]
    want = arrays[0] + arrays[1]
    for other in arrays[2:]:
        want += other
    for got in run(_rank_order, world_size, n, shared):
        assert got.tobytes() == want.tobytes()


def _stats(comm, n):
    x = np.ones(n, np.float32)
    allreduce(comm, x, algorithm="shared_memory", out=x)
    window = vars(comm.stats).copy()
    allreduce(comm, x, algorithm="ring", out=x)
    ring = {key: value - window.get(key, 0) for key, value in vars(comm.stats).items()}
    return has_windows(comm), window, ring


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_window_is_charged_as_the_exchange_it_replaces(world_size):
    n = AREA // 4 + 10                  # windows where there are any, else the ring itself
    for r, (windows, stats, ring) in enumerate(run(_stats, world_size, n)):
        if not windows:                 # (MINIDIST_CROSS_MEMORY=0: its pieces are the ring's own)
            assert stats == ring
            continue
        mine = (n // world_size + (r < n % world_size)) * 4
        assert stats["bytes_sent"] == stats["bytes_received"] == n * 4 - mine + (world_size - 1) * mine
        assert stats["messages_sent"] == stats["messages_received"] == 2 * (world_size - 1)


def _without_windows(comm):
    big = np.full(AREA // 4 + 1, comm.rank + 1.0, np.float32)
    buffer = shared_empty(comm, big.shape, np.float32)
    buffer[...] = big
    meetings = comm.shared_area().meetings
    results = [allreduce(comm, big, algorithm="shared_memory"), allreduce(comm, buffer, algorithm="auto")]
    try:
        comm.shared_area().window(big, [0, 0], [0, 0])
        refused = None
    except RuntimeError as error:
        refused = str(error)
    return has_windows(comm), comm.shared_area().meetings - meetings, results, refused


def test_without_cross_memory_copies_large_arrays_take_the_ring(monkeypatch):
    monkeypatch.setenv("MINIDIST_CROSS_MEMORY", "0")
    for windows, meetings, results, refused in run(_without_windows, 2):
        assert not windows and meetings == 0             # the same answer on every rank: no window
        for got in results:
            assert np.array_equal(got, np.full(AREA // 4 + 1, 3.0, np.float32))
        assert "cross-memory" in refused


def test_auto_takes_windows_for_large_arrays_only_where_there_are_windows():
    for p in range(2, 9):
        big = WINDOW_MIN_BYTES
        assert choose_algorithm(big, big // 4, p, shared_bytes=AREA, windows=True) == "shared_memory"
        assert choose_algorithm(big - 4, big // 4 - 1, p, shared_bytes=AREA, windows=True) == "rabenseifner"
        assert choose_algorithm(big, big // 4, p, shared_bytes=AREA) == "rabenseifner"
        assert choose_algorithm(4096, 1024, p, shared_bytes=AREA, windows=True) == "shared_memory"
    assert run(lambda comm: has_windows(comm), 2) == [cross_memory.available()] * 2
    assert run(lambda comm: has_windows(comm.split(0)), 2) == [False, False]     # no area: no windows


def _dies_inside_a_window(comm):
    from minidist.cluster import window

    if comm.rank == 1:          # rank 1 dies once every array is exposed: rank 0 reaches a process gone
        window.Window.get = lambda *args: os._exit(3)
    x = np.ones(AREA // 4 + 1000, np.float32)
    allreduce(comm, x, algorithm="shared_memory", out=x)


@windows_here
def test_a_rank_that_dies_inside_a_window_ends_the_run_with_its_name():
    with pytest.raises(RuntimeError, match="rank 1") as failure:
        run(_dies_inside_a_window, 2, timeout=30)
    assert "exit" in str(failure.value) or "died" in str(failure.value)
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(f"minidist_{os.getpid()}_")]
