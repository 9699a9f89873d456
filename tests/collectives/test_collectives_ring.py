"""What the ring_allreduce exercise requires, checked on the cluster's ledger (lessons/EXERCISES.md):

reduce-scatter then allgather, 2(P − 1) steps of one message each way per rank, each message one of the
P chunks of np.array_split — so every rank sends and receives exactly 2(P − 1)/P · n elements when P
divides n (and all ranks together 2(P − 1) · n elements whatever n) — and the exact result, bitwise the
same on every rank. Sending whole arrays (everyone to everyone, or through one rank) fails here.
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.collectives import allreduce
from tests.collectives.bitwise import mismatch
from tests.collectives.collectives_data import exact, rank_arrays

LENGTHS = (840, 1001, 5, 1, 0)   # 840 divides by 2..8; 1001 and 5 do not; 1 and 0 are shorter than P


def _ring_traffic(comm):
    out = []
    for n in LENGTHS:
        x = rank_arrays(n, comm.world_size, (n,), np.float32)[comm.rank]
        before = vars(comm.stats).copy()
        result = allreduce(comm, x, algorithm="ring")
        out.append(({k: v - before[k] for k, v in vars(comm.stats).items()}, result))
    return out


@pytest.mark.exercise("ring_allreduce")
@pytest.mark.promise("traffic")
@pytest.mark.parametrize("world_size", [2, 3, 4, 5, 8])
def test_ring_traffic_is_the_textbook_formula(world_size):
    p, itemsize = world_size, 4
    per_rank = run(_ring_traffic, p)
    for i, n in enumerate(LENGTHS):
        want = exact(rank_arrays(n, p, (n,), np.float32), "sum")
        stats = [per_rank[r][i][0] for r in range(p)]
        for r in range(p):
            assert (wrong := mismatch(per_rank[r][i][1], want, r, p, f"n = {n}")) is None, wrong
            assert stats[r]["messages_sent"] == stats[r]["messages_received"] == 2 * (p - 1), (n, r, stats[r])
            low, high = 2 * (p - 1) * (n // p) * itemsize, 2 * (p - 1) * -(-n // p) * itemsize
            assert low <= stats[r]["bytes_sent"] <= high, f"n = {n}: rank {r} sent chunks of another size"
            if n % p == 0:
                assert stats[r]["bytes_sent"] == stats[r]["bytes_received"] == 2 * (p - 1) * n // p * itemsize
        assert sum(s["bytes_sent"] for s in stats) == 2 * (p - 1) * n * itemsize, n
