"""Messages bigger than a mailbox, read straight out of the sender's array (cross_memory.py), arrive bitwise
as through the mailbox, are counted the same, and fail, stall and deadlock as every other message does."""

import os
import threading
import time

import numpy as np
import pytest

from minidist.cluster import ClusterError, cross_memory, run
from minidist.cluster.cross_memory import REMOTE_MIN_BYTES, goes_remote
from minidist.cluster.layout import ACK
from minidist.collectives import allreduce
from minidist.collectives.ring import ring_allreduce

from .test_cluster_deadlock import count, expect_deadlock, fall_asleep
from .test_cluster_failures import assert_nothing_left, child_pids
from .test_cluster_waiting import endpoints

pytestmark = pytest.mark.skipif(not cross_memory.available(), reason="no process_vm_readv here")

N = 3 * 2**20 // 4 + 7          # int32 elements: 3 MiB and a bit, more than a 2 MiB mailbox holds


@pytest.fixture(params=["1", "0"], ids=["cross-memory", "mailbox"])
def transport(request, monkeypatch):
    """Run each test with large messages read remotely, and again streamed through the mailbox."""
    monkeypatch.setenv("MINIDIST_CROSS_MEMORY", request.param)
    return request.param == "1"


def exchange(comm, n: int, seed: int):
    """Every rank sends an integer array to the right (sendrecv), then sums one from the left into a copy
    of its own (recv op= base=), then receives a third message straight into a strided ``out``."""
    rng = np.random.default_rng(seed + comm.rank)
    mine = rng.integers(-1000, 1000, n).astype(np.int32)
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    got = comm.sendrecv(mine, dst=right, src=left)
    total = np.empty_like(mine)
    if comm.rank % 2 == 0:                  # (an even world size: even ranks send first)
        comm.send(mine, right, tag=1)
        comm.recv(left, tag=1, out=total, op="sum", base=mine)
    else:
        comm.recv(left, tag=1, out=total, op="sum", base=mine)
        comm.send(mine, right, tag=1)
    strided = np.zeros((n, 2), np.int32)
    comm.sendrecv(mine, dst=right, src=left, sendtag=2, recvtag=2, out=strided[:, 1])
    return got, total, strided[:, 1].copy(), comm.stats, comm._ep.cross_memory


@pytest.mark.parametrize("world_size", [2, 4])
def test_large_messages_arrive_bitwise_and_are_counted_as_sent(transport, world_size):
    results = run(exchange, world_size, N, 5, timeout=120)
    for rank, (got, total, strided, stats, remote) in enumerate(results):
        left = (rank - 1) % world_size
        theirs = np.random.default_rng(5 + left).integers(-1000, 1000, N).astype(np.int32)
        mine = np.random.default_rng(5 + rank).integers(-1000, 1000, N).astype(np.int32)
        assert remote is transport
        assert np.array_equal(got, theirs) and np.array_equal(strided, theirs)
        assert np.array_equal(total, mine + theirs)
        assert stats.bytes_sent == stats.bytes_received == 3 * N * 4        # payload bytes, exactly
        assert stats.messages_sent == stats.messages_received == 3


def test_only_messages_bigger_than_the_mailbox_and_a_mebibyte_go_remote():
    ep = endpoints(2, cores=2)[0]                  # a 4 KiB mailbox
    ep.cross_memory = True
    assert not goes_remote(ep, ep.layout.capacity)
    assert not goes_remote(ep, REMOTE_MIN_BYTES - 1)
    assert goes_remote(ep, REMOTE_MIN_BYTES)
    ep.cross_memory = False
    assert not goes_remote(ep, 10 * REMOTE_MIN_BYTES)


def ring_of(comm, n: int):
    x = (np.arange(n, dtype=np.float32) % 97) * (comm.rank + 1) - 50
    by_ring = ring_allreduce(comm, x.copy())
    in_place = x.copy()
    allreduce(comm, in_place, out=in_place)
    return by_ring, in_place, allreduce(comm, x, algorithm="auto"), comm.stats


@pytest.mark.parametrize("world_size", [2, 3])
def test_allreduce_over_large_chunks_is_bitwise_the_same_on_every_rank(transport, world_size):
    n = 4 * 2**20 * world_size // 4 + 3          # chunks of 4 MiB: remote
    results = run(ring_of, world_size, n, timeout=120)
    expected = sum((np.arange(n, dtype=np.float32) % 97) * (r + 1) - 50 for r in range(world_size))
    for by_ring, in_place, auto, _ in results:
        for got in (by_ring, in_place, auto):
            assert got.tobytes() == results[0][0].tobytes()
        assert np.array_equal(by_ring, expected)          # integer-valued: exact in float32


def big_to_another_communicator_first(comm):
    """Rank 0 sends a large message on a sub-communicator, then one on the world; rank 1 asks for the
    world's first, so the large one is read whole and set aside until asked for."""
    pair = comm.split(0)
    big = np.arange(N, dtype=np.int32)
    if comm.rank == 0:
        pair.send(big, 1)             # waits until rank 1 has read it: rank 1 stashes it
        comm.send(np.array([7]), 1)
        return None
    first = comm.recv(0)
    later = pair.recv(0)
    return int(first[0]), bool(np.array_equal(later, big))


def test_a_large_message_of_another_communicator_is_set_aside(transport):
    assert run(big_to_another_communicator_first, 2, timeout=120)[1] == (7, True)


# -- failures, deadlocks, returned peers -----------------------------------------------------------------
def test_both_ranks_sending_large_first_is_a_deadlock(transport):
    def fn(comm):
        other = 1 - comm.rank
        comm.send(np.zeros(N, np.int32), other)
        comm.recv(other)

    expect_deadlock(fn, 2, "waits for send to rank 1 (tag 0)", "waits for send to rank 0 (tag 0)")


def test_a_receiver_that_returns_leaves_the_sender_a_peer_returned_error(transport):
    def fn(comm):
        if comm.rank == 0:
            comm.send(np.zeros(N, np.int32), 1)

    with pytest.raises(ClusterError, match=r"rank 0 raised PeerReturnedError: rank 0 waits for "):
        run(fn, 2, timeout=60)


def test_a_receiver_that_fails_stops_the_waiting_sender(transport):
    def fn(comm):
        if comm.rank == 0:
            comm.send(np.zeros(N, np.int32), 1)
        else:
            time.sleep(0.2)
            raise ValueError("receiver failed")

    before = child_pids()
    with pytest.raises(ClusterError, match=r"rank 1 raised ValueError: receiver failed"):
        run(fn, 2, timeout=60)
    assert_nothing_left(before)


def test_a_sender_that_dies_while_its_message_waits_is_named_not_the_reader(transport):
    def fn(comm):
        if comm.rank == 0:
            threading.Timer(0.2, os._exit, (3,)).start()    # dies while it waits for rank 1 to read
            comm.send(np.zeros(N, np.int32), 1)
        else:
            time.sleep(0.6)
            comm.recv(0)            # (cross-memory: the sender's process is gone when the copy starts)

    before = child_pids()
    with pytest.raises(ClusterError, match=r"rank 0 exited with code 3") as info:
        run(fn, 2, timeout=60)
    assert info.value.rank == 0
    assert_nothing_left(before)


def test_a_slow_receiver_is_not_a_deadlock(transport):
    def fn(comm):
        if comm.rank == 0:
            comm.send(np.ones(N, np.int32), 1)      # waits, asleep, while rank 1 computes for a while
            return 0
        time.sleep(0.3)
        return int(comm.recv(0).sum())

    assert run(fn, 2, timeout=60) == [0, N]


def test_find_deadlock_reads_a_wait_for_a_taken_message():
    ep = endpoints(2, cores=2)[0]
    fall_asleep(ep, 0, send_to=1)
    ep.ctrl[ep.status[0]], ep.ctrl[ep.status[0] + 4] = ACK, 3        # until rank 1 has read 3 slots
    count(ep, "written", 0, 1, 3)
    count(ep, "read", 0, 1, 2)
    fall_asleep(ep, 1, recv_from=0)
    count(ep, "read", 0, 1, 3)
    assert ep.find_deadlock() is None, "rank 1 has taken the message: rank 0 may go on"
    count(ep, "read", 0, 1, 2)
    count(ep, "written", 0, 1, 2)      # (as if the slot were not there: rank 1 has nothing to read)
    assert ep.find_deadlock() == (
        "deadlock: every rank is waiting and no message can arrive: rank 0 waits for send to rank 1 "
        "(tag 0); rank 1 waits for recv from rank 0 (tag 0)")


def pass_right(comm, n: int):
    x = np.arange(n, dtype=np.int64) * (comm.rank + 1)
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    got = comm.sendrecv(x, dst=right, src=left, out=np.empty_like(x), op="sum", base=x)
    return got, comm._ep.cross_memory


def test_spawned_ranks_read_each_other_too():
    n = 3 * 2**20 // 8
    results = run(pass_right, 3, n, start_method="spawn", timeout=120)
    for rank, (got, remote) in enumerate(results):
        left = (rank - 1) % 3
        assert remote and np.array_equal(got, np.arange(n, dtype=np.int64) * (rank + 1 + left + 1))
