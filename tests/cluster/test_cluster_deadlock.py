"""Deadlocks are caught within a poll or two, with an error saying what every rank waits for; and never
reported where there is none (a rank that computes, sleeps or streams a big message is not a deadlock)."""

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.cluster import ClusterError, mailbox, run
from minidist.cluster.mailbox import DATA, ROOM, Endpoint

from .test_cluster_failures import assert_nothing_left, child_pids
from .test_cluster_waiting import endpoints

BIG = np.zeros(2**20, np.float32)       # 4 MiB: more than a 2 MiB mailbox holds


def expect_deadlock(fn, world_size: int, *waits: str) -> str:
    """Run ``fn``; it must fail with a DeadlockError naming every rank's wait, quickly, leaving nothing."""
    before = child_pids()
    start = time.monotonic()
    with pytest.raises(ClusterError, match=r"raised DeadlockError: deadlock: ") as info:
        run(fn, world_size, timeout=60)
    assert time.monotonic() - start < 5.0, (
        "a deadlock should be reported within a poll or two, not at the timeout"
    )
    message = str(info.value).splitlines()[0]
    expected = "; ".join(f"rank {r} {what}" for r, what in enumerate(waits))
    assert message.endswith("every rank is waiting and no message can arrive: " + expected), message
    assert_nothing_left(before)
    return message


# -- deadlocks ---------------------------------------------------------------------------------------------
def both_recv_first(comm):
    other = 1 - comm.rank
    comm.recv(other)
    comm.send(np.zeros(1), other)


def test_two_ranks_that_both_receive_first():
    expect_deadlock(
        both_recv_first, 2, "waits for recv from rank 1 (tag 0)", "waits for recv from rank 0 (tag 0)"
    )


def ring_receive_first(comm):
    left, right = (comm.rank - 1) % comm.world_size, (comm.rank + 1) % comm.world_size
    comm.recv(left, tag=3)
    comm.send(np.ones(2), right, tag=3)


@settings(max_examples=3)
@given(world_size=st.integers(3, 6))
def test_ring_where_everyone_receives_first(world_size):
    waits = [f"waits for recv from rank {(r - 1) % world_size} (tag 3)" for r in range(world_size)]
    expect_deadlock(ring_receive_first, world_size, *waits)


def both_send_big_first(comm):
    other = 1 - comm.rank
    comm.send(BIG, other)          # half of it fits in the mailbox, then it waits for room
    comm.recv(other)


def test_two_ranks_that_both_send_more_than_the_mailbox_holds():
    expect_deadlock(
        both_send_big_first, 2, "waits for send to rank 1 (tag 0)", "waits for send to rank 0 (tag 0)"
    )


def mixed(comm):
    if comm.rank == 0:
        comm.recv(1)
    elif comm.rank == 1:
        comm.send(BIG, 2)
        comm.send(np.zeros(1), 0)
    else:
        comm.recv(0)
        comm.recv(1)


def test_receivers_and_a_blocked_sender_in_a_cycle():
    expect_deadlock(mixed, 3, "waits for recv from rank 1 (tag 0)", "waits for send to rank 2 (tag 0)",
                    "waits for recv from rank 0 (tag 0)")


def barrier_against_recv(comm):
    """Rank 0's barrier message (of a sub-communicator) reaches rank 1, which sets it aside: it waits for
    a message of tag 0. Rank 2 takes no part and returns."""
    pair = comm.split(0 if comm.rank < 2 else None)
    if comm.rank == 0:
        pair.barrier()
    elif comm.rank == 1:
        comm.recv(0)


def test_a_stashed_message_and_a_returned_rank_do_not_hide_a_deadlock():
    expect_deadlock(barrier_against_recv, 3, "waits for recv from rank 1 (barrier)",
                    "waits for recv from rank 0 (tag 0)", "returned")


def test_waiting_for_a_returned_rank_is_still_a_peer_returned_error():
    def fn(comm):
        if comm.rank == 1:
            comm.recv(0)        # rank 0 has returned: the sharper PeerReturnedError, not a deadlock
        elif comm.rank == 2:
            comm.recv(1)

    with pytest.raises(ClusterError, match=r"rank 1 raised PeerReturnedError"):
        run(fn, 3, timeout=60)


# -- no false alarms ---------------------------------------------------------------------------------------
def one_rank_computes(comm, big: bool):
    """Rank 0 is busy (its status says "running") for 0.3 s, several polls, while the others wait on it."""
    if comm.rank == 0:
        time.sleep(0.3)
        for peer in range(1, comm.world_size):
            comm.send(np.full(3, peer), peer)
        return comm.recv(1)[0]
    if comm.rank == 1:
        comm.send(BIG if big else np.zeros(1), 0)      # big: it waits for room while rank 0 sleeps
    return comm.recv(0)[0]


@pytest.mark.parametrize("world_size, big", [(2, True), (3, False), (4, True)])
def test_ranks_waiting_for_a_busy_rank_are_not_deadlocked(world_size, big):
    assert run(one_rank_computes, world_size, big, timeout=60) == [0.0] + list(range(1, world_size))


def busy_program(comm, seed: int):
    """Random steps on every rank (the same sequence, from the same seed): sendrecv around the ring,
    barrier, or send + recv between pairs, of small or mailbox-overflowing arrays; one random rank
    sleeps a little before each step (sometimes longer than a poll). Returns (checksum, detector calls)."""
    rng = np.random.default_rng(seed)
    p, me = comm.world_size, comm.rank
    left, right, partner = (me - 1) % p, (me + 1) % p, me ^ 1
    total = 0.0
    for _ in range(300):
        op, sleeper = rng.integers(3), rng.integers(p)
        nap = rng.choice([0.0, 0.001, 0.004, 0.06], p=[.5, .3, .17, .03])    # 0.06 s: longer than a poll
        n = int(rng.choice([1, 1000, 600_000], p=[.6, .35, .05]))       # 600k float32 = 2.4 MiB > mailbox
        if me == sleeper:
            time.sleep(nap)
        x = np.full(n, me, np.float32)
        if op == 0:
            total += comm.sendrecv(x, right, left)[0]
        elif op == 1:
            comm.barrier()
        elif partner < p and me % 2 == 0:
            comm.send(x, partner)
            total += comm.recv(partner)[0]
        elif partner < p:
            total += comm.recv(partner)[0]
            comm.send(x, partner)
    return total, CALLS[0]


def token_ring(comm, laps: int):
    """One token goes round: at each hand-over every rank sleeps in ``wait`` for a moment, and one of
    them has data it has not noticed yet. Without the second snapshot the detector cries wolf here."""
    p, me = comm.world_size, comm.rank
    token = np.zeros(1)
    for _ in range(laps):
        if me == 0:
            comm.send(token + 1, 1)
            token = comm.recv(p - 1)
        else:
            token = comm.recv(me - 1)
            comm.send(token + 1, (me + 1) % p)
    return token[0], CALLS[0]


CALLS = [0]      # find_deadlock calls in this process (each rank counts its own)


@pytest.fixture
def eager_detector(monkeypatch):
    """Poll every 0.5 ms instead of every 50 (the forked ranks inherit it), counting the detector's calls,
    so that it looks at thousands of moments of a run."""
    monkeypatch.setattr(mailbox, "POLL", 0.0005)
    detect = Endpoint.find_deadlock

    def counted(ep):
        CALLS[0] += 1
        return detect(ep)

    monkeypatch.setattr(Endpoint, "find_deadlock", counted)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_a_long_busy_program_is_never_taken_for_a_deadlock(seed, eager_detector):
    results = run(busy_program, 8, seed, timeout=120)
    assert sum(calls for _, calls in results) > 1000, "the detector should have been consulted often"


@pytest.mark.slow
def test_a_token_ring_is_never_taken_for_a_deadlock(eager_detector):
    results = run(token_ring, 8, 500, timeout=120)
    assert results[0][0] == 8 * 500
    assert sum(calls for _, calls in results) > 100, "the detector should have been consulted often"


# -- the detector on hand-written status lines ---------------------------------------------------------------
def fall_asleep(ep: Endpoint, rank: int, send_to: int = -1, recv_from: int = -1) -> None:
    """Write ``rank``'s status line as ``wait`` does before it sleeps."""
    st = ep.status[rank]
    ep.ctrl[st + 5] += 1
    ep.ctrl[st + 1], ep.ctrl[st + 2] = send_to, recv_from
    ep.ctrl[st] = (ROOM if send_to >= 0 else 0) | (DATA if recv_from >= 0 else 0)


def count(ep: Endpoint, name: str, src: int, dst: int, value: int) -> None:
    ep.ctrl[ep.layout.line(name, src, dst)] = value


def test_find_deadlock_on_status_lines():
    ep = endpoints(3, cores=2)[0]
    assert ep.find_deadlock() is None, "everyone running"
    fall_asleep(ep, 0, recv_from=1)
    fall_asleep(ep, 1, recv_from=0)
    assert ep.find_deadlock() is None, "rank 2 is running: it may still send"
    fall_asleep(ep, 2, send_to=0, recv_from=1)                  # a sendrecv
    count(ep, "written", 2, 0, 16)  # ... whose mailbox 2 -> 0 is full
    assert ep.find_deadlock() == (
        "deadlock: every rank is waiting and no message can arrive: rank 0 waits for "
        "recv from rank 1 (tag 0); rank 1 waits for recv from rank 0 (tag 0); rank 2 "
        "waits for send to rank 0 + recv from rank 1 (tag 0)"
    )
    count(ep, "read", 2, 0, 1)
    assert ep.find_deadlock() is None, "a slot is free in mailbox 2 -> 0"
    count(ep, "read", 2, 0, 0)
    count(ep, "written", 0, 1, 1)
    assert ep.find_deadlock() is None, "rank 1 has a message to read (whatever it is)"
    count(ep, "read", 0, 1, 1)
    assert ep.find_deadlock() is not None
    ep.ctrl[ep.layout.line("done", 1)] = 1
    assert ep.find_deadlock() is None, "ranks 0 and 2 wait for a rank that returned: PeerReturnedError's case"


def test_find_deadlock_trusts_only_two_identical_snapshots():
    ep = endpoints(2, cores=2)[0]
    fall_asleep(ep, 0, recv_from=1)
    fall_asleep(ep, 1, recv_from=0)
    assert ep.find_deadlock() is not None
    line = ep.layout.line

    def rank_1_moves_on(name, a=0, b=0):
        """While the detector reads the counters, rank 1 wakes up, sends, and sleeps again."""
        if name == "written":
            ep.ctrl[ep.status[1]] = 0
            fall_asleep(ep, 1, recv_from=0)
        return line(name, a, b)

    ep.layout.line = rank_1_moves_on
    assert ep.find_deadlock() is None, "rank 1 was awake while the counters were read"
