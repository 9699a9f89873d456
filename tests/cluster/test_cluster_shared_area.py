"""Waiting in the shared area (a meeting, shared_area.py) fails as waiting for a message does: a failing
rank is named within seconds, a timeout and a deadlock say who waits to meet whom, a rank that returned
or one in another call is reported, and nothing is left behind (fork and spawn)."""

import time

import numpy as np
import pytest

from minidist.cluster import ClusterError, run
from minidist.cluster.layout import DATA, MEET
from minidist.collectives import allreduce

from .test_cluster_deadlock import CALLS, eager_detector, expect_deadlock  # noqa: F401 (a fixture)
from .test_cluster_failures import assert_nothing_left, child_pids, ring_then
from .test_cluster_waiting import endpoints

WAITS_TO_MEET = "rank 1 to meet (allreduce in the shared area)"


def meeting_then(failure):
    """Every rank but rank 1 enters a shared-area allreduce; rank 1 fails as ``ring_then`` makes it."""
    ring_step = ring_then(failure)

    def fn(comm):
        if comm.rank == 1:
            return ring_step(comm)          # its ring step, then the failure: the others wait to meet it
        comm.sendrecv(np.arange(5.0), (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size)
        return allreduce(comm, np.ones(10), algorithm="shared_memory")
    return fn


EXPECTED = {
    "raise": r"rank 1 raised ValueError: rank one is broken",
    "exit": r"rank 1 exited with code 3",
    "kill": r"rank 1 was killed by signal SIGKILL",
    "hang": r"timed out after 1 s; still running: rank 0: " + WAITS_TO_MEET.replace("(", r"\(").replace(
        ")", r"\)") + "; rank 1: running",
}


@pytest.mark.parametrize("failure", ["raise", "exit", "kill", "hang"])
def test_a_rank_failing_while_the_others_wait_to_meet_it(failure):
    before = child_pids()
    start = time.monotonic()
    with pytest.raises(ClusterError, match=EXPECTED[failure]) as info:
        run(meeting_then(failure), 4, timeout=1.0 if failure == "hang" else 20.0)
    assert time.monotonic() - start < (4.0 if failure == "hang" else 3.0)
    if failure != "hang":
        assert info.value.rank == 1
    assert_nothing_left(before)


def meet_or_recv(comm):
    """Rank 0 meets in the shared area (outside any collective); rank 1 waits for a message from it."""
    if comm.rank == 0:
        area = comm.shared_area()
        area.arrays(np.float64, 1)
        area.meet(sent=[0, 0], received=[0, 0])
    else:
        comm.recv(0)


def test_a_meeting_nobody_comes_to_is_a_deadlock():
    expect_deadlock(meet_or_recv, 2, f"waits for {WAITS_TO_MEET}", "waits for recv from rank 0 (tag 0)")


def test_meeting_a_rank_that_returned_is_a_collective_mismatch():
    def fn(comm):
        if comm.rank == 0:
            allreduce(comm, np.ones(3), algorithm="shared_memory")

    with pytest.raises(ClusterError, match=r"rank 0 raised ValueError: collective mismatch.*waits for a "
                                           r"meeting in the shared area with rank 1 \(tag -4\), but rank 1's "
                                           r"function has already returned"):
        run(fn, 2, timeout=20)


@pytest.mark.parametrize("other", ["ring", "shared_memory"])
def test_ranks_in_different_calls_find_out(other):
    def fn(comm):
        n = 4 if comm.rank == 0 else 6                  # rank 1: another length (and maybe algorithm)
        allreduce(comm, np.ones(n), algorithm="shared_memory" if comm.rank == 0 else other)

    with pytest.raises(ClusterError, match=r"raised (ValueError|MessageMismatchError): collective mismatch"):
        run(fn, 2, timeout=20)


def test_under_spawn_the_area_works_and_nothing_is_left():
    before = child_pids()
    results = run(lambda comm: allreduce(comm, np.full(5, comm.rank + 1), algorithm="shared_memory"), 3,
                  start_method="spawn", timeout=60)
    assert all(np.array_equal(r, np.full(5, 6)) for r in results)
    assert_nothing_left(before)


def test_find_deadlock_reads_a_meeting():
    ep = endpoints(2, cores=2)[0]
    st0, st1 = ep.status
    ep.ctrl[st0 + 5] += 1
    ep.ctrl[st0 + 2], ep.ctrl[st0 + 3], ep.ctrl[st0 + 6], ep.ctrl[st0] = 1, -4, 1, MEET  # rank 1's meeting 1
    ep.ctrl[st1 + 5] += 1
    ep.ctrl[st1 + 2], ep.ctrl[st1] = 0, DATA                                           # data from rank 0
    assert ep.find_deadlock().endswith(f"rank 0 waits for {WAITS_TO_MEET}; rank 1 waits for recv from "
                                       "rank 0 (tag 0)")
    ep.ctrl[ep.layout.line("meet", 1)] = 1
    assert ep.find_deadlock() is None, "rank 1 has reached the meeting: rank 0 may go on"


def meetings_among_messages(comm, seed: int):
    """Shared-area allreduces (whole or in two phases) between ring steps and barriers; one random rank
    naps before each step, sometimes longer than a poll. Returns (checksum, detector calls)."""
    rng = np.random.default_rng(seed)
    p, me, total = comm.world_size, comm.rank, 0.0
    for _ in range(200):
        op, sleeper = rng.integers(3), rng.integers(p)
        nap = rng.choice([0.0, 0.001, 0.004, 0.06], p=[.5, .3, .17, .03])    # 0.06 s: longer than a poll
        n = int(rng.choice([1, 1000, 20_000]))                            # 80 KB: two phases
        if me == sleeper:
            time.sleep(nap)
        x = np.full(n, me, np.float32)
        if op == 0:
            total += allreduce(comm, x, algorithm="shared_memory")[-1]
        elif op == 1:
            total += comm.sendrecv(x, (me + 1) % p, (me - 1) % p)[0]
        else:
            comm.barrier()
    return total, CALLS[0]


@pytest.mark.slow
@pytest.mark.usefixtures("eager_detector")
def test_ranks_waiting_to_meet_are_never_taken_for_a_deadlock():
    p, seed = 4, 5
    results = run(meetings_among_messages, p, seed, timeout=120)
    rng, ops = np.random.default_rng(seed), []
    for _ in range(200):                            # the same draws: how many allreduces, ring steps
        ops.append(rng.integers(3))
        rng.integers(p), rng.choice(4, p=[.5, .3, .17, .03]), rng.choice(3)
    for me, (total, _) in enumerate(results):     # an allreduce gives 0 + 1 + 2 + 3, a step the left rank
        assert total == 6 * ops.count(0) + (me - 1) % p * ops.count(1)
    assert sum(calls for _, calls in results) > 100, "the detector should have been consulted often"
