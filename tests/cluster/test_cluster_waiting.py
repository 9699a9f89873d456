"""How ranks wait and check: the spin rule, all_equal, and the memory setting and core of each rank's
process."""

import os
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.cluster import run
from minidist.cluster.mailbox import DATA, Endpoint, Layout
from minidist.cluster.process_setup import keep_freed_memory


def endpoints(world_size: int, cores: int) -> list[Endpoint]:
    """Every rank's endpoint over one block in this process (nobody really waits)."""
    layout = Layout(world_size, mailbox_bytes=4096)
    block = memoryview(bytearray(layout.total_bytes))
    return [Endpoint(layout, r, block, doorbells=[], cores=cores) for r in range(world_size)]


def fall_asleep(ep: Endpoint, rank: int, waiting_for: int) -> None:
    """Write ``rank``'s status line as ``wait`` does before it sleeps: data from ``waiting_for``."""
    st = ep.status[rank]
    ep.ctrl[st + 2], ep.ctrl[st] = waiting_for, DATA


@pytest.mark.parametrize("world_size, cores", [(1, 1), (2, 2), (2, 8), (4, 4)])
def test_spin_when_ranks_fit_on_the_cores(world_size, cores):
    assert all(ep.may_spin() for ep in endpoints(world_size, cores))


def test_spin_only_while_the_awake_ranks_fit_on_the_cores():
    eps = endpoints(4, cores=2)
    assert not eps[0].may_spin(), "4 awake ranks on 2 cores: a spinner would delay the others"
    fall_asleep(eps[0], 2, waiting_for=0)
    assert not eps[0].may_spin(), "still 3 awake ranks on 2 cores"
    fall_asleep(eps[0], 3, waiting_for=0)
    assert eps[0].may_spin() and eps[1].may_spin(), "2 awake ranks (0 and 1) on 2 cores"
    eps[0].ctrl[eps[0].layout.line("done", 3)] = 1
    assert eps[0].may_spin(), "a rank that returned needs no core"


def test_one_core_never_spins():
    eps = endpoints(2, cores=1)
    assert not eps[0].may_spin()
    fall_asleep(eps[0], 1, waiting_for=0)
    assert eps[0].may_spin(), "the only awake rank may spin: nobody else needs the core"


def _all_equal(comm, values):
    before = (comm.clock, comm.stats.messages_sent, comm.stats.bytes_sent)
    answer = comm.all_equal(values[comm.rank])
    return answer, before == (comm.clock, comm.stats.messages_sent, comm.stats.bytes_sent)


@given(world_size=st.integers(1, 8), odd_one=st.integers(0, 7), offset=st.sampled_from([0, 1, -1, 2**40]))
def test_all_equal_is_the_same_answer_on_every_rank(world_size, odd_one, offset):
    values = [12345] * world_size
    values[odd_one % world_size] += offset
    results = run(_all_equal, world_size, values)
    expected = offset == 0 or world_size == 1
    assert [answer for answer, _ in results] == [expected] * world_size, results
    assert all(untouched for _, untouched in results), "all_equal must not count bytes or move the clock"


def _where_a_big_array_lives(comm, keep: bool):
    """(on the heap?, heap top kept after freeing it?) for a 32 MiB array made in this rank."""
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    libc.sbrk.restype = ctypes.c_void_p
    if not keep:                      # undo the launcher's setting: glibc's default thresholds
        libc.mallopt(-3, 128 * 1024)
        libc.mallopt(-1, 128 * 1024)
    big = np.ones(8 << 20, np.float32)        # 32 MiB
    heap_top = libc.sbrk(0)
    on_heap = big.ctypes.data < heap_top      # mmap'ed blocks live far above the heap
    del big
    return on_heap, libc.sbrk(0) == heap_top


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_ranks_keep_freed_big_blocks_for_reuse():
    assert run(lambda comm: keep_freed_memory(), 1) == [True]     # in a rank: it changes the process
    assert run(_where_a_big_array_lives, 1, True) == [(True, True)], \
        "in a rank a 32 MiB array should come from the heap, and the heap should keep it once freed"
    assert run(_where_a_big_array_lives, 1, False) == [(False, True)], \
        "with glibc's defaults the same array is a fresh mmap (the cost keep_freed_memory removes)"


def affinity(comm):
    return sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this system")
@pytest.mark.parametrize("pin", ["1", "0"])
def test_each_rank_takes_a_core_of_its_own_where_there_are_enough(monkeypatch, pin):
    monkeypatch.setenv("MINIDIST_PIN", pin)
    cores = sorted(os.sched_getaffinity(0))
    for world_size in (2, len(cores) + 1, 2 * len(cores) + 1):
        got = run(affinity, world_size)
        if pin == "1" and len(cores) > 1:
            first = cores.index(got[0][0])
            expected = [[cores[(first + r) % len(cores)]] for r in range(world_size)]
            assert got == expected, "one core each, consecutive in rank order; more ranks: round-robin"
        else:
            assert got == [cores] * world_size, "MINIDIST_PIN=0 (or a single core): not bound"
    assert run(affinity, 1) == [cores], "a run of one rank is not bound"
    assert sorted(os.sched_getaffinity(0)) == cores, "the launcher itself is never bound"
