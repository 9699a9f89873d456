"""allreduce through the shared area (``algorithm="shared_memory"``, and ``auto`` where it takes it): the
exact reduction in rank order, bitwise the same on every rank; charged as the messages it replaces; the
ring wherever there is no area, or the array does not fit and there are no windows
(test_collectives_window.py has the windows).

hypothesis draws the world size (1-8) and a few cases (length 0-3000 or 4100-9000, not divisible by P,
or a few elements: reduced whole or in two phases; float32, float64 or int64; sum, max or min) with
integer values, so that every result compares bitwise with the single-process reduction.
"""

import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.cluster import cross_memory, run
from minidist.collectives import allreduce, choose_algorithm
from minidist.collectives.shared_memory import WHOLE_BYTES, ring_time, shared_area_bytes, shared_memory_time
from tests.collectives.collectives_data import exact, rank_arrays

AREA = 2**20                       # bytes the shared area of ``run`` takes per rank (layout.py)
shared_cases = st.lists(st.tuples(st.integers(0, 2**32 - 1),
                                  st.one_of(st.integers(0, 3000), st.integers(0, 9),
                                            st.integers(4100, 9000)),      # above WHOLE_BYTES: 2 phases
                                  st.sampled_from([np.float32, np.float64, np.int64]),
                                  st.sampled_from(["sum", "max", "min"])), min_size=1, max_size=3)


def _shared_and_auto(comm, case_list):
    results = []
    for seed, n, dtype, op in case_list:
        x = rank_arrays(seed, comm.world_size, (n,), dtype)[comm.rank]
        in_place = x.copy()
        results += [allreduce(comm, x, op=op, algorithm="shared_memory"),
                    allreduce(comm, x, op=op, algorithm="auto"),
                    allreduce(comm, in_place, op=op, algorithm="shared_memory", out=in_place)]
    return results


@pytest.mark.slow
@given(world_size=st.integers(1, 8), case_list=shared_cases)
def test_shared_memory_and_auto_give_the_exact_reduction_on_every_rank(world_size, case_list):
    per_rank = run(_shared_and_auto, world_size, case_list)
    for i, (seed, n, dtype, op) in enumerate(case_list):
        want = exact(rank_arrays(seed, world_size, (n,), dtype), op)
        for rank in range(world_size):
            for got in per_rank[rank][3 * i:3 * i + 3]:
                assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (rank, n, dtype, op)


def _many_calls_drifting_apart(comm, calls):
    """Calls of varying sizes, ranks sleeping now and then: a rank may write the next call's input
    while another still reads the last result (the two parities of the area)."""
    rng = np.random.default_rng(comm.rank)
    totals = []
    for call in range(calls):
        n = 1 + call % 13 if call % 3 else 3000 + call       # reduced whole, or in two phases
        x = np.full(n, comm.rank * 1000 + call, dtype=np.int64)
        if rng.random() < 0.1:
            time.sleep(0.002)
        totals.append(int(allreduce(comm, x, algorithm="shared_memory").sum()))
    return totals


def test_many_calls_in_a_row_with_ranks_drifting_apart():
    p, calls = 3, 200
    want = [(1 + c % 13 if c % 3 else 3000 + c) * sum(r * 1000 + c for r in range(p)) for c in range(calls)]
    assert run(_many_calls_drifting_apart, p, calls, timeout=120) == [want] * p


def _stats_and_clock(comm, n, algorithm):
    x = np.ones(n, np.float32)
    allreduce(comm, x, algorithm=algorithm)
    return comm.stats, comm.clock


@pytest.mark.parametrize("world_size, n", [(2, 1000), (3, 7), (5, 0), (2, 8192), (3, 4099), (4, 8192)])
def test_charged_as_the_exchange_it_replaces(world_size, n):
    shared = run(_stats_and_clock, world_size, n, "shared_memory")
    small = n * 4 <= WHOLE_BYTES
    by_messages = run(_stats_and_clock, world_size, n, "naive" if small else "ring")
    for r, (stats, clock) in enumerate(shared):
        if small:       # naive's exchange: every rank reads every other rank's whole array
            assert stats.bytes_sent == stats.bytes_received == (world_size - 1) * n * 4
            assert stats.messages_sent == stats.messages_received == world_size - 1
        else:           # phase 1: the others read their pieces of my array; phase 2: my piece, each
            mine = (n // world_size + (r < n % world_size)) * 4       # np.array_split's piece r, in bytes
            assert stats.bytes_sent == stats.bytes_received == n * 4 - mine + (world_size - 1) * mine
            assert stats.messages_sent == stats.messages_received == 2 * (world_size - 1)
        if small or n % world_size == 0:        # equal pieces: the clock of the same exchange by messages
            assert clock == pytest.approx(by_messages[r][1])


def _fallbacks(comm):
    pair = comm.split(comm.rank // 2)                      # {0, 1} and {2}: no shared area
    big = np.ones(AREA // 4 + 1, np.float32)               # one item more than the area holds
    allreduce(pair, np.ones(0), algorithm="shared_memory")  # nothing, without an area: 2 (P − 1) messages
    by_pair = allreduce(pair, np.full(5, comm.rank + 1.0), algorithm="shared_memory")
    before, meetings = comm.stats.messages_sent, comm.shared_area().meetings
    by_world = allreduce(comm, big, algorithm="shared_memory")
    return (shared_area_bytes(pair), pair.stats, by_pair, comm.stats.messages_sent - before, by_world,
            comm.shared_area().meetings - meetings)


def test_without_an_area_the_ring_runs_and_past_its_room_a_window_or_the_ring():
    results = run(_fallbacks, 3)
    for rank, (area, pair_stats, by_pair, world_messages, by_world, meetings) in enumerate(results):
        assert area == 0
        assert pair_stats.messages_sent == (4 if rank < 2 else 0)        # two rings of two: 2 · 2 (P − 1)
        assert np.array_equal(by_pair, np.full(5, 3.0))                  # 1 + 2, or rank 2's 3 alone
        assert world_messages == 4 and np.array_equal(by_world, np.full(AREA // 4 + 1, 3.0))
        assert meetings == (2 if cross_memory.available() else 0)       # a window (2 meetings), or the ring


def test_choose_algorithm_takes_the_area_where_it_fits_and_wins():
    for p in range(2, 9):
        assert choose_algorithm(4096, 1024, p, shared_bytes=AREA) == "shared_memory"
        assert choose_algorithm(AREA, AREA // 4, p, shared_bytes=AREA) == "shared_memory"
        assert choose_algorithm(AREA + 4, AREA // 4 + 1, p, shared_bytes=AREA) == "rabenseifner"
        assert choose_algorithm(4096, 1024, p) == "recursive_doubling"           # no area: MPICH's rule
        assert choose_algorithm(0, 0, p) == "recursive_doubling"                 # even for nothing
        assert shared_memory_time(4096, p) < ring_time(4096, p)
    # the model: two meetings against 2(P − 1) message steps; bytes copied 2 + 1/P times against 4(P − 1)/P
    huge = 2**40
    assert shared_memory_time(huge, 2) > ring_time(huge, 2)                  # at P = 2 the ring copies less
    assert choose_algorithm(huge, huge // 4, 2, shared_bytes=huge) == "rabenseifner"


def test_shared_area_bytes_is_zero_for_a_communicator_without_one():
    class Plain:                                           # e.g. a test double, or the MPI backend's
        rank, world_size = 0, 2

    assert shared_area_bytes(Plain()) == 0
    assert run(lambda comm: shared_area_bytes(comm), 2) == [AREA, AREA]
