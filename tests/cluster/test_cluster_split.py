"""comm.split makes sub-communicators whose messages never mix with the parent's."""

import numpy as np

from minidist.cluster import run


def test_split_orders_by_key_and_keeps_messages_apart():
    def fn(comm):
        sub = comm.split(color=comm.rank % 2, key=-comm.rank)      # evens and odds, reversed
        # world rank 0 sends on the world communicator first, then on the sub-communicator ...
        if comm.rank == 0:
            comm.send(np.array([100]), 2)
            sub.send(np.array([200]), sub.rank - 1)                 # world rank 0 -> world rank 2
        # ... and world rank 2 receives them in the other order: the first waits aside.
        got = None
        if comm.rank == 2:
            got = [int(sub.recv(sub.rank + 1)[0]), int(comm.recv(0)[0])]
        total = sub.sendrecv(np.array([comm.rank]), (sub.rank + 1) % sub.world_size,
                             (sub.rank - 1) % sub.world_size)
        sub.barrier()
        return sub.rank, sub.world_size, got, int(total[0]), sub.stats.messages_sent, comm.stats.messages_sent

    results = run(fn, 6)
    # evens: world ranks 4, 2, 0 become sub ranks 0, 1, 2; odds: 5, 3, 1
    assert [r[:2] for r in results] == [(2, 3), (2, 3), (1, 3), (1, 3), (0, 3), (0, 3)]
    assert results[2][2] == [200, 100]
    by_sub_rank = {0: [4, 5], 1: [2, 3], 2: [0, 1]}
    for world_rank, (sub_rank, size, _, left, sub_sent, world_sent) in enumerate(results):
        assert left == by_sub_rank[(sub_rank - 1) % size][world_rank % 2]
        assert sub_sent == 1 + (world_rank == 0) and world_sent == (world_rank == 0)


def test_split_with_none_and_nested_splits():
    def fn(comm):
        if comm.rank == 4:
            assert comm.split(None) is None
            return None
        half = comm.split(comm.rank // 2)                          # {0,1} {2,3}
        single = half.split(half.rank)                             # every rank alone
        assert single.world_size == 1 and single.rank == 0
        x = half.sendrecv(np.array([comm.rank]), 1 - half.rank, 1 - half.rank)
        return int(x[0])

    assert run(fn, 5) == [1, 0, 3, 2, None]
