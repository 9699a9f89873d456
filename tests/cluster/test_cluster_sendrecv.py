"""send/recv/sendrecv/barrier move arrays exactly: every dtype and shape, tags, streams, world sizes 1-8."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.cluster import ClusterError, run

ROOT = Path(__file__).resolve().parents[2]

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64, np.complex64, np.complex128, "U3", "S5", "datetime64[ms]"]


def make_array(rng, shape, dtype):
    values = rng.integers(0, 100, size=shape)
    return np.asarray(values).astype(dtype)


def ring_exchange(comm, arrays):
    """Every rank sends each array (offset by its rank where numeric) to the next rank, eagerly."""
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    received = []
    for tag, a in enumerate(arrays):
        comm.send(a, right, tag=tag)
        received.append(comm.recv(left, tag=tag))
    return received


@pytest.mark.slow
@given(world_size=st.integers(2, 8), seed=st.integers(0, 2**32 - 1),
       shapes=st.lists(st.lists(st.integers(0, 5), max_size=4).map(tuple), min_size=1, max_size=4))
def test_ring_keeps_every_dtype_and_shape(world_size, seed, shapes):
    rng = np.random.default_rng(seed)
    arrays = [make_array(rng, shape, dtype) for shape in shapes for dtype in DTYPES]
    results = run(ring_exchange, world_size, arrays)
    for received in results:
        assert len(received) == len(arrays)
        for got, sent in zip(received, arrays, strict=True):
            assert got.dtype == sent.dtype and got.shape == sent.shape
            assert np.array_equal(got, sent)


def test_zero_d_empty_and_non_contiguous_inputs(rng):
    base = rng.standard_normal((6, 8))
    arrays = [np.float64(3.5), np.array(7, np.int16), np.empty((0, 3)), base.T, base[::2, 1::3],
              np.asfortranarray(base), base[:, ::-1], np.array(5, ">i4"), np.arange(3, dtype=">f8")]

    def fn(comm):
        if comm.rank == 0:
            for a in arrays:
                comm.send(a, 1)
            return None
        got = [comm.recv(0) for _ in arrays]
        return got, [g.dtype.str for g in got]      # (pickling a 0-d array back loses its byte order)

    received, dtypes = run(fn, 2)[1]
    assert dtypes == [np.asarray(a).dtype.str for a in arrays]
    for got, sent in zip(received, arrays, strict=True):
        assert got.shape == np.shape(sent)
        assert np.array_equal(got, sent)
        assert got.flags.c_contiguous


@pytest.mark.parametrize("world_size", [1, 3])
def test_world_size_one_and_results_in_rank_order(world_size):
    assert run(lambda comm: (comm.rank, comm.world_size), world_size) == [(r, world_size) for r in
                                                                         range(world_size)]


def test_large_messages_stream_through_a_small_mailbox(rng):
    big = rng.standard_normal(100_003)          # 800 KB through a 4 KiB mailbox: ~200 segments

    def fn(comm, x):
        if comm.rank == 0:
            comm.send(x, 1, tag=4)
            return comm.recv(1, tag=5)
        y = comm.recv(0, tag=4)
        comm.send(y * 2, 0, tag=5)
        return y

    back, forth = run(fn, 2, big, mailbox_bytes=4096)
    assert np.array_equal(forth, big) and np.array_equal(back, big * 2)


@pytest.mark.parametrize("world_size", [2, 5])
def test_sendrecv_ring_of_large_messages_does_not_deadlock(world_size):
    def fn(comm):
        x = np.full(100_000, comm.rank, np.float32)     # 400 kB each, through an 8 KiB mailbox
        right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
        y = comm.sendrecv(x, right, left)
        z = comm.sendrecv(x, right, left, out=np.ones_like(x), op="sum")
        return y[0], y[-1], z[0], z.size

    results = run(fn, world_size, mailbox_bytes=8192)
    for rank, (first, last, summed, size) in enumerate(results):
        left = (rank - 1) % world_size
        assert first == last == left and summed == left + 1 and size == 100_000


def test_many_back_to_back_messages_keep_their_order():
    def fn(comm):
        if comm.rank == 0:
            for i in range(500):
                comm.send(np.array([i]), 1, tag=i % 7)
            return comm.stats
        got = [int(comm.recv(0, tag=i % 7)[0]) for i in range(500)]
        return got, comm.stats

    stats0, (got, stats1) = run(fn, 2)
    assert got == list(range(500))
    assert (stats0.messages_sent, stats0.bytes_sent) == (500, 500 * 8)
    assert (stats1.messages_received, stats1.bytes_received) == (500, 500 * 8)
    assert stats0.bytes_received == stats1.bytes_sent == 0


@pytest.mark.parametrize("op, combine", [("sum", np.add), ("max", np.maximum), ("min", np.minimum),
                                         ("prod", np.multiply)])
def test_recv_into_out_and_combine_with_op(op, combine, rng):
    x = rng.integers(-9, 9, size=(50, 7)).astype(np.float64)
    y = rng.integers(-9, 9, size=(50, 7)).astype(np.float64)

    def fn(comm):
        if comm.rank == 0:
            comm.send(x, 1)
            comm.send(x, 1)
            comm.send(x, 1)
            return None
        plain = np.zeros_like(x)
        same = comm.recv(0, out=plain)
        acc = y.copy()
        combined = comm.recv(0, out=acc, op=op)
        strided = np.asfortranarray(y)          # not C-contiguous: received through a temporary
        comm.recv(0, out=strided, op=op)
        return same is plain, plain, combined is acc, acc, strided

    same, plain, same_acc, acc, strided = run(fn, 2, mailbox_bytes=2048)[1]
    assert same and same_acc
    assert np.array_equal(plain, x)
    assert np.array_equal(acc, combine(y, x)) and np.array_equal(strided, combine(y, x))


@pytest.mark.parametrize("op, combine", [("sum", np.add), ("max", np.maximum)])
def test_combine_with_a_base_leaves_the_base_alone(op, combine, rng):
    x = rng.integers(-9, 9, size=(300, 7)).astype(np.float32)       # 8.4 KB: several 2 KiB segments
    base = rng.integers(-9, 9, size=(300, 7)).astype(np.float32)

    def fn(comm):
        if comm.rank == 0:
            for _ in range(3):
                comm.send(x, 1)
            return None
        kept = base.copy()
        kept.flags.writeable = False                  # base is only read
        out = np.full_like(x, np.nan)                 # out's old values must not matter
        same = comm.recv(0, out=out, op=op, base=kept) is out
        strided_out = np.asfortranarray(np.full_like(x, np.nan))       # through a temporary
        comm.recv(0, out=strided_out, op=op, base=kept)
        in_place = base.copy()                        # base may be out itself: op= without base
        comm.recv(0, out=in_place, op=op, base=in_place)
        return same, out, strided_out, in_place, kept

    same, out, strided_out, in_place, kept = run(fn, 2, mailbox_bytes=2048 * 16)[1]
    assert same
    for got in (out, strided_out, in_place):
        assert np.array_equal(got, combine(base, x))
    assert np.array_equal(kept, base)


def test_barrier_orders_ranks():
    def fn(comm):
        for _ in range(3):
            comm.barrier()
        return comm.stats

    for stats in run(fn, 6):
        assert stats.messages_sent == stats.bytes_sent == 0        # barriers are not counted


def test_spawn_start_method():
    results = run(ring_exchange, 3, [np.arange(10.0), np.array(["ab", "c"])], start_method="spawn")
    for received in results:
        assert np.array_equal(received[0], np.arange(10.0)) and list(received[1]) == ["ab", "c"]


def test_tag_mismatch_names_both_sides():
    def fn(comm):
        if comm.rank == 0:
            comm.send(np.zeros(3, np.float32), 1, tag=7)
        else:
            comm.recv(0, tag=8)

    with pytest.raises(ClusterError, match=r"rank 1 raised MessageMismatchError.*tag 8.*tag 7") as info:
        run(fn, 2, timeout=20)
    assert info.value.rank == 1


def test_out_shape_and_dtype_mismatch_names_both_sides():
    def fn(comm):
        if comm.rank == 0:
            comm.send(np.zeros((2, 3), np.float32), 1)
        else:
            comm.recv(0, out=np.zeros((3, 2), np.float64))

    with pytest.raises(ClusterError, match=r"float64 \(3, 2\).*float32 \(2, 3\)"):
        run(fn, 2, timeout=20)


def test_sendrecv_waits_only_for_its_unfinished_half():
    """Rank 0's send is done and its destination has returned: it still waits for its receive, asleep."""
    def fn(comm):
        if comm.rank == 0:
            cpu = time.process_time()
            got = int(comm.sendrecv(np.array([10]), 1, 2)[0])
            assert time.process_time() - cpu < 0.1, "waiting 0.3 s must not burn CPU"
            return got
        if comm.rank == 1:
            return int(comm.recv(0)[0])
        time.sleep(0.3)                          # long enough for rank 1 to return first
        comm.send(np.array([20]), 0)
        return None

    assert run(fn, 3, timeout=20) == [20, 10, None]


def test_user_code_cannot_swallow_the_abort():
    def fn(comm):
        if comm.rank == 0:
            raise RuntimeError("first failure")
        try:
            comm.recv(0)
        except Exception:  # noqa: BLE001 - a careless handler must not hide the abort
            time.sleep(30)

    start = time.monotonic()
    with pytest.raises(ClusterError, match="rank 0 raised RuntimeError: first failure"):
        run(fn, 2, timeout=20)
    assert time.monotonic() - start < 3.0


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_one_blas_thread_per_worker_and_the_parent_is_left_alone(start_method):
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def fn(comm):
        from threadpoolctl import threadpool_info

        a = np.ones((64, 64))
        a @ a
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    before = [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]
    for threads in run(fn, 2, start_method=start_method):
        assert threads and all(n == 1 for n in threads)
    after = [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]
    assert after == before


BLAS_LOADED_LATER = """
import json
import numpy as np
from threadpoolctl import threadpool_info
from minidist.cluster import run

def blas_threads(comm=None):
    from threadpoolctl import threadpool_info
    return sorted(lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas")

run(blas_threads, 2)                                 # the first run, before SciPy brings its own BLAS
import scipy.linalg  # noqa: E402
print(json.dumps({"parent": blas_threads(), "ranks": run(blas_threads, 2)}))
"""


def test_a_blas_library_loaded_after_the_first_run_also_gets_one_thread():
    pytest.importorskip("threadpoolctl")
    pytest.importorskip("scipy")
    out = subprocess.run([sys.executable, "-c", BLAS_LOADED_LATER], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr[-2000:]
    threads = json.loads(out.stdout)
    if len(threads["parent"]) < 2 or max(threads["parent"]) == 1:
        pytest.skip(f"SciPy brought no second BLAS with more than one thread: {threads['parent']}")
    assert threads["ranks"] == [[1, 1], [1, 1]]

@pytest.mark.slow
@given(world_size=st.integers(2, 6), sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=3))
def test_shifted_exchanges_through_tiny_mailboxes(world_size, sizes):
    """All-to-all by shifts: every rank streams through 1 KiB mailboxes both ways at once, asleep in turns."""
    def fn(comm):
        p, me = comm.world_size, comm.rank
        got = {}
        for n in sizes:
            for shift in range(1, p):
                x = np.arange(n, dtype=np.int64) * p + me
                y = comm.sendrecv(x, (me + shift) % p, (me - shift) % p, sendtag=shift, recvtag=shift)
                got[(n, shift)] = bool(np.array_equal(y, np.arange(n) * p + (me - shift) % p))
        return all(got.values())

    assert all(run(fn, world_size, mailbox_bytes=1024, timeout=60))
