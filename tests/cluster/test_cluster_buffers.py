"""Buffers the transport must refuse or carry whole: overlapping send/receive buffers, long dtype names."""

import numpy as np
import pytest

from minidist.cluster import ClusterError, checks, run

BIG = 1_000_000          # 8 MB of float64: far more than a 2 MiB mailbox holds, so the message streams


def _sendrecv_in_place(comm, n):
    x = np.full(n, float(comm.rank))
    peer = 1 - comm.rank
    comm.sendrecv(x, dst=peer, src=peer, out=x)


@pytest.mark.parametrize("n", [BIG, 8])
def test_sendrecv_refuses_a_send_array_that_is_also_out(n):
    with pytest.raises(ClusterError, match=r"raised ValueError: sendrecv's send array and out= overlap"):
        run(_sendrecv_in_place, 2, n, timeout=30)


def _sendrecv_separate(comm, n):
    x = np.full(n, float(comm.rank))
    peer = 1 - comm.rank
    got = comm.sendrecv(x, dst=peer, src=peer, out=np.empty_like(x))
    return got, x


def test_sendrecv_into_a_separate_array_gives_exactly_the_peers_values():
    for rank, (got, x) in enumerate(run(_sendrecv_separate, 2, BIG, timeout=60)):
        np.testing.assert_array_equal(got, np.full(BIG, float(1 - rank)))
        np.testing.assert_array_equal(x, np.full(BIG, float(rank)))


def _refused_before_anything_is_sent(comm):
    """Rank 0 first tries a sendrecv whose out= overlaps its send array (a shifted view), then a good one."""
    buf = np.arange(2 * BIG, dtype=np.float64) + 10 * comm.rank
    if comm.rank == 0:
        with pytest.raises(ValueError, match="overlap"):
            comm.sendrecv(buf[:BIG], dst=1, src=1, out=buf[BIG // 2:BIG // 2 + BIG])
        assert (comm.stats.messages_sent, comm.stats.bytes_sent, comm.clock) == (0, 0, 0.0)
    return comm.sendrecv(buf[:BIG], dst=1 - comm.rank, src=1 - comm.rank, out=np.empty(BIG))


def test_an_overlap_is_refused_before_anything_is_sent_or_counted():
    got = run(_refused_before_anything_is_sent, 2, timeout=60)
    np.testing.assert_array_equal(got[1], np.arange(BIG, dtype=np.float64))
    np.testing.assert_array_equal(got[0], np.arange(BIG, dtype=np.float64) + 10)


def _recv_with_base(comm, how, n):
    if comm.rank == 1:
        comm.send(np.full(n, 100.0), 0)
        return None
    buf = np.arange(n + 1, dtype=np.float64)
    out = buf[:n]
    base = {"out itself": out, "the same view": buf[:n], "shifted": buf[1:]}[how]
    return comm.recv(1, out=out, op="sum", base=base)


@pytest.mark.parametrize("n", [BIG, 8])
def test_recv_refuses_a_base_that_overlaps_out_unless_it_is_out(n):
    for how in ("out itself", "the same view"):
        np.testing.assert_array_equal(run(_recv_with_base, 2, how, n, timeout=60)[0], np.arange(n) + 100.0)
    with pytest.raises(ClusterError, match=r"rank 0 raised ValueError: base= and out= overlap"):
        run(_recv_with_base, 2, "shifted", n, timeout=30)


# -- dtypes --------------------------------------------------------------------------------------------------
DTYPES = ([np.dtype(c) for c in "?" + np.typecodes["AllInteger"] + np.typecodes["AllFloat"]]
          + [np.dtype(name) for name in ("U7", "S3", "V5", ">f8", ">i4", "<M8[ns]", ">m8[25s]", "M8[D]",
                                         "m8[2147483647ns]", "M8[2147483647as]", ">m8[2147483647as]")])


def _echo(comm, arrays):
    """Rank 0 sends every array to rank 1 and gets it back; returns (dtype name, shape, bytes) of what came
    back (not the arrays: pickling a result may change its byte order)."""
    back = []
    for a in arrays:
        if comm.rank == 0:
            comm.send(a, 1)
            got = comm.recv(1)
            back.append((got.dtype.str, got.shape, got.tobytes()))
        else:
            comm.send(comm.recv(0), 0)
    return back


@pytest.mark.parametrize("length", [3, 300_000])     # one slot, and streamed through many
def test_every_dtype_round_trips_bitwise_long_names_included(length):
    rng = np.random.default_rng(7)
    arrays = [np.frombuffer(rng.bytes(length * d.itemsize), d).reshape(length, 1) for d in DTYPES]
    assert max(len(a.dtype.str) for a in arrays) > 16, "a dtype name longer than the old 16-byte header field"
    back = run(_echo, 2, arrays, timeout=120)[0]
    assert back == [(a.dtype.str, a.shape, a.tobytes()) for a in arrays]


def test_a_dtype_name_the_header_cannot_carry_is_refused_before_sending(monkeypatch):
    monkeypatch.setattr(checks, "DTYPE_CHARS", 8)
    monkeypatch.setattr(checks, "_SENDABLE", set())
    checks.check_payload(np.zeros(2, "m8[2ns]"))             # '<m8[2ns]' is 8 characters: fits
    with pytest.raises(ValueError, match=r"dtype's name in at most 8 characters; '<m8\[12ns\]' has 9"):
        checks.check_payload(np.zeros(2, "m8[12ns]"))
