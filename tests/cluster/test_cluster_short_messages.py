"""One-slot messages (post_short / take_short) and the streaming path agree, and collective calls are told
apart.

A 4 KiB mailbox of 16 slots has 256-byte segments, so messages of 0-1200 bytes cross the one-slot limit
(segment − itemsize) both ways; sending 20 before receiving fills the mailbox, so the short path must
hand over to the streaming one in the middle of a run of messages.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.cluster import ClusterError, MessageMismatchError, run
from minidist.collectives import allgather, allreduce, alltoall, reduce_scatter

DTYPES = ["u1", "<f8", ">i4", "c16", "U3"]


def _arrays(seed, sizes):
    rng = np.random.default_rng(seed)
    dtypes = [np.dtype(DTYPES[i % len(DTYPES)]) for i in range(len(sizes))]
    return [rng.integers(0, 100, size=max(0, n // dt.itemsize)).astype(dt)
            for n, dt in zip(sizes, dtypes, strict=True)]


def _exchange(comm, arrays):
    """Rank 0 sends every array (some on a sub-communicator, whose messages are set aside), then rank 1
    answers each with a sendrecv; rank 1 sums a copy of each numeric array into what it received."""
    sub = comm.split(0)
    if comm.rank == 0:
        for i, a in enumerate(arrays):
            (sub if i % 3 == 2 else comm).send(a, 1, tag=i)
        return [comm.sendrecv(a, 1, 1, sendtag=i, recvtag=i) for i, a in enumerate(arrays)]
    got = [(sub if i % 3 == 2 else comm).recv(0, tag=i) for i in range(len(arrays))]
    echoed = [comm.sendrecv(g, 0, 0, sendtag=i, recvtag=i) for i, g in enumerate(got)]
    for g, e in zip(got, echoed, strict=True):
        if g.dtype.kind in "uifc":
            comm.send(g, 0, tag=99)
            comm.recv(0, tag=99, out=e, op="sum")       # a short message combined with op=
    return got, echoed, [g.dtype.str for g in got]      # (pickling back to the parent loses byte order)


@given(seed=st.integers(0, 2**32 - 1), sizes=st.lists(st.integers(0, 1200), min_size=1, max_size=20))
def test_short_and_streamed_messages_arrive_whole_and_in_order(seed, sizes):
    arrays = _arrays(seed, sizes)

    def fn(comm):
        result = _exchange(comm, arrays)
        if comm.rank == 0:          # rank 1's "+= its own copy" messages: consume them in order
            for a in arrays:
                if a.dtype.kind in "uifc":
                    comm.send(comm.recv(1, tag=99), 1, tag=99)
        return result

    back, (got, echoed, dtypes) = run(fn, 2, mailbox_bytes=4096)
    assert dtypes == [a.dtype.str for a in arrays]
    for a, g, e, b in zip(arrays, got, echoed, back, strict=True):
        assert g.shape == a.shape and np.array_equal(g, a)
        assert np.array_equal(b, a)
        if a.dtype.kind in "uifc":
            assert np.array_equal(e, a + a)


def test_a_full_mailbox_hands_short_messages_to_the_streaming_path():
    def fn(comm):
        if comm.rank == 0:
            for i in range(40):                 # 16 slots: the 17th send waits for the reader
                comm.send(np.array([i, -i]), 1)
            return None
        return [comm.recv(0)[0] for _ in range(40)]

    assert run(fn, 2, mailbox_bytes=4096)[1] == list(range(40))


def test_a_plain_recv_refuses_a_collective_message_and_the_reverse():
    def fn(comm, plain_first):
        other = 1 - comm.rank
        if comm.rank == 0:
            if plain_first:
                comm.send(np.ones(2), other)
            else:
                with comm.collective("allreduce(size=2)"):
                    comm.send(np.ones(2), other)
            return
        if plain_first:
            with comm.collective("allreduce(size=2)"):
                comm.recv(other)
        else:
            comm.recv(other)

    with pytest.raises(
        ClusterError,
        match="collective mismatch: rank 1 called allreduce.size=2., but not every "
        "rank made the same call: the next message from rank 0 is a plain send",
    ):
        run(fn, 2, True)
    with pytest.raises(
        ClusterError,
        match="collective mismatch: rank 1 expects a plain message from rank 0, but "
        "the next one is a message of a collective call",
    ):
        run(fn, 2, False)


def test_collective_blocks_nest_and_restore_plain_messages():
    def fn(comm):
        other = 1 - comm.rank
        with comm.collective("outer"):
            with comm.collective("inner"):
                inner = comm.sendrecv(np.array([comm.rank]), other, other)
            outer = comm.sendrecv(np.array([10 + comm.rank]), other, other)
        plain = comm.sendrecv(np.array([20 + comm.rank]), other, other)
        return int(inner[0]), int(outer[0]), int(plain[0])

    assert run(fn, 2) == [(1, 11, 21), (0, 10, 20)]


def test_a_mismatched_message_is_refused_before_it_is_consumed():
    def fn(comm):
        if comm.rank == 0:
            with comm.collective("call A"):
                comm.send(np.arange(3), 1)
            return None
        with comm.collective("call B"), pytest.raises(MessageMismatchError):
            comm.recv(0)
        with comm.collective("call A"):         # the message is still there, for the right call
            return comm.recv(0)

    assert np.array_equal(run(fn, 2)[1], np.arange(3))


COLLECTIVES = {
    "allreduce_rd": lambda c: allreduce(c, np.ones(5), algorithm="recursive_doubling"),
    "allreduce_ring": lambda c: allreduce(c, np.ones(5), algorithm="ring"),
    "allreduce_auto": lambda c: allreduce(c, np.ones(5), algorithm="auto"),
    "allgather": lambda c: allgather(c, np.ones(2)),
    "reduce_scatter": lambda c: reduce_scatter(c, np.ones(6)),
    "alltoall": lambda c: alltoall(c, [np.ones(2)] * c.world_size),
}


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_the_agreement_rides_on_the_data_no_message_is_added(name, world_size):
    def fn(comm):
        COLLECTIVES[name](comm)
        return sum(comm._ep.seq), comm.stats.messages_sent    # every message that left this rank

    for through_mailboxes, counted in run(fn, world_size):
        # auto takes the shared area here: its reads are counted, but none goes through a mailbox
        assert through_mailboxes == (0 if name == "allreduce_auto" else counted)
        assert counted == world_size - 1 or name != "allreduce_auto"      # one read of each peer's array
