"""Shared buffers (cluster/shared_buffers.py, ``collectives.shared_empty``): arrays in the shared block,
handed out page by page, given back once the last view is gone, and an ordinary array where there is
no room or no area."""

import gc

import numpy as np
import pytest

from minidist.cluster import cross_memory, run
from minidist.cluster.layout import PAGE, Layout
from minidist.collectives import shared_empty

CAPACITY = Layout(2).buffer_bytes


def _hand_out(comm):
    buffers = comm.shared_area().buffers
    a = buffers.empty((3, 5), np.float64)
    b = buffers.empty(7, np.int32)
    empty = buffers.empty(0, np.float32)
    a[...], b[...] = 1.5, comm.rank            # writable, and nothing else moves
    starts = [x.ctypes.data - comm._ep.raw.ctypes.data for x in (a, b, empty)]
    spans = [(s, s + x.nbytes) for s, x in zip(starts, (a, b, empty), strict=True)]
    return (a.shape, a.dtype, b.shape, buffers.holds(a), buffers.holds(np.ones(3)), starts, spans,
            float(a.sum()), int(b.sum()), buffers.free_bytes)


def test_buffers_are_pages_of_this_ranks_region():
    for rank, (shape, dtype, b_shape, held, private, starts, spans, a_sum, b_sum, free) in enumerate(
            run(_hand_out, 2)):
        assert (shape, dtype, b_shape, held, private) == ((3, 5), np.float64, (7,), True, False)
        region = Layout(2).buffers(rank)
        assert all(s % PAGE == 0 and region <= s < region + CAPACITY for s in starts)   # own pages
        assert spans[0][1] <= spans[1][0] <= spans[1][1] <= spans[2][0]                  # no overlap
        assert (a_sum, b_sum) == (22.5, 7 * rank)
        assert free == CAPACITY - 3 * PAGE                     # every array takes whole pages, even empty


def _given_back(comm):
    buffers = comm.shared_area().buffers
    full = buffers.free_bytes
    a = buffers.empty(PAGE + 1, np.uint8)               # two pages
    view = a[10:20].reshape(2, 5)
    del a
    gc.collect()
    held_by_view = buffers.free_bytes                   # the view keeps the memory
    view[...] = 7
    del view
    gc.collect()
    after = buffers.free_bytes
    big = buffers.empty(CAPACITY // 8, np.float64)      # the whole region: only after the merges
    too_big = buffers.empty(1, np.uint8)                # nothing left
    fallback = shared_empty(comm, 4, np.float32)        # an ordinary array instead
    del big
    gc.collect()
    return full, held_by_view, after, too_big, buffers.holds(fallback), fallback.shape


def test_memory_comes_back_once_the_last_view_is_gone_and_a_full_region_falls_back():
    for full, held_by_view, after, too_big, fallback_shared, shape in run(_given_back, 2):
        assert full == CAPACITY and held_by_view == CAPACITY - 2 * PAGE and after == CAPACITY
        assert too_big is None and not fallback_shared and shape == (4,)


def _elsewhere(comm):
    pair = comm.split(0)                     # a sub-communicator: no area, an ordinary array
    x = shared_empty(pair, (2, 3), np.float32)
    try:
        comm.shared_area().buffers.empty((-1,), np.float32)
    except ValueError as error:
        return x.shape, comm.shared_area().buffers.holds(x), str(error)


def test_no_area_gives_an_ordinary_array_and_a_bad_shape_a_clear_error():
    for shape, held, message in run(_elsewhere, 2):
        assert shape == (2, 3) and not held and "sizes >= 0" in message


def test_shared_empty_without_a_cluster_is_numpy():
    class Plain:                             # e.g. a test double, or the MPI backend's communicator
        rank, world_size = 0, 1

    x = shared_empty(Plain(), 5, np.int64)
    assert x.shape == (5,) and x.dtype == np.int64
    with pytest.raises(ValueError):
        shared_empty(Plain(), -1, np.int64)


BAD_SHAPES = [2.5, (2, 2.7), True, (2, True), "3", None, np.array(2.5), [[2]]]     # np.empty refuses each


def _refusals(comm):
    class Plain:
        rank, world_size = 0, 1

    buffers = comm.shared_area().buffers
    full, refused = buffers.free_bytes, []
    for where in (comm, comm.split(0), Plain()):          # the area, a sub-communicator, no cluster at all
        for shape, dtype in [*((shape, np.float32) for shape in BAD_SHAPES),
                             (3, object), (3, [("count", np.int64), ("name", object)]), (3, "bogus")]:
            try:
                shared_empty(where, shape, dtype)
                refused.append(None)
            except TypeError as error:
                refused.append(str(error))
    for shape in BAD_SHAPES:
        try:
            buffers.empty(shape, np.float32)
            refused.append(None)
        except TypeError as error:
            refused.append(str(error))
    untouched = buffers.free_bytes == full
    shapes = (np.int64(3), np.array([2, 3]), (), [np.int32(4)])          # what np.empty takes too
    good = [shared_empty(comm, shape, np.int16) for shape in shapes]
    empty_items = shared_empty(comm, (2, 3), "V0")                  # items of no bytes: np.empty's array
    return refused, untouched, [(x.shape, buffers.holds(x)) for x in [*good, empty_items]]


def test_a_shape_or_dtype_that_np_empty_refuses_is_refused_by_name_on_every_path():
    for shape in BAD_SHAPES:
        with pytest.raises(TypeError):
            np.empty(shape, np.float32)
    for refused, untouched, good in run(_refusals, 2):
        checks = [*(["shape"] * len(BAD_SHAPES) + ["dtype"] * 3) * 3, *["shape"] * len(BAD_SHAPES)]
        assert len(refused) == len(checks)
        for message, argument in zip(refused, checks, strict=True):
            assert message is not None and message.startswith(argument), message
        assert "object" in refused[len(BAD_SHAPES)]
        assert untouched                                   # refused before any memory was handed out
        assert good == [((3,), True), ((2, 3), True), ((), True), ((4,), True), ((2, 3), False)]


def test_a_block_whose_arrays_outlive_the_rank_is_left_quietly():
    from multiprocess.shared_memory import SharedMemory

    from minidist.cluster.process_setup import leave_block

    shm = SharedMemory(create=True, size=PAGE)
    try:
        kept = np.frombuffer(shm.buf[:64], np.uint8)      # a shared buffer that outlives the function
        with pytest.raises(BufferError):
            shm.close()                                  # what SharedMemory's finalizer would meet at exit
        leave_block(shm)
        shm.close()                                      # now quiet: the process's exit unmaps the block
        kept[...] = 1                                    # and the array still works until then
    finally:
        shm.unlink()


def _large_messages_from_buffers(comm, n):
    from minidist.collectives import allreduce

    def refuse(*args):
        raise AssertionError("a shared buffer was copied by the kernel")

    cross_memory.pull = refuse                   # what a message from a private array would call
    x = shared_empty(comm, n, np.float32)
    x[...] = np.arange(n, dtype=np.float32) % 7 + comm.rank
    allreduce(comm, x, algorithm="ring", out=x)  # chunks above the mailbox: read straight out of the sender
    incoming = comm.sendrecv(x, dst=(comm.rank + 1) % comm.world_size, src=(comm.rank - 1) % comm.world_size,
                             out=np.ones(n, np.float32), op="sum")
    return x, incoming


@pytest.mark.skipif(not cross_memory.available(), reason="large messages go through the mailbox here")
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_large_message_from_a_shared_buffer_is_read_in_place(world_size):
    n = world_size * (3 << 20) // 4 + 5          # ring chunks of about 3 MiB: more than a mailbox holds
    want = sum(np.arange(n, dtype=np.float32) % 7 + r for r in range(world_size))
    for x, incoming in run(_large_messages_from_buffers, world_size, n):
        assert x.tobytes() == want.tobytes()
        assert incoming.tobytes() == (want + 1).tobytes()
