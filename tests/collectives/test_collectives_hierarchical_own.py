"""hierarchical_allreduce alone: the exact result for every op, bitwise the same on every rank, on nodes
of every shape the cluster allows (one node, one rank per node, lengths shorter than a node)."""

import numpy as np
import pytest

from minidist.cluster import Topology, run
from minidist.collectives import allreduce
from tests.collectives.hierarchical_diagnosis import diagnose_hierarchical

REDUCE = {"sum": np.sum, "max": np.max, "min": np.min}


def _data(rank: int, n: int) -> np.ndarray:
    return np.random.default_rng(rank + 100).integers(-50, 50, n).astype(np.float64)


def _all_ops(comm, n):
    return [allreduce(comm, _data(comm.rank, n), op=op, algorithm="hierarchical") for op in REDUCE]


@pytest.mark.exercise("hierarchical_allreduce")
@pytest.mark.diagnose
def test_each_level_holds_the_right_ranks_sums_piece_by_piece():
    for nodes, per_node, n in ((2, 2, 8), (2, 3, 5), (1, 4, 3), (4, 1, 2)):
        wrong = diagnose_hierarchical(nodes, per_node, n)
        assert wrong is None, wrong


@pytest.mark.exercise("hierarchical_allreduce")
@pytest.mark.parametrize("nodes, per_node", [(2, 2), (2, 4), (4, 2), (1, 4), (4, 1), (2, 3)])
@pytest.mark.parametrize("n", [1, 7, 40])
def test_every_op_is_exact_and_bitwise_the_same_on_every_rank(nodes, per_node, n):
    p = nodes * per_node
    results = run(_all_ops, p, n, link=Topology(nodes, per_node))
    stack = np.stack([_data(r, n) for r in range(p)])
    for i, (op, reduce) in enumerate(REDUCE.items()):
        for rank in range(p):
            y = results[rank][i]
            assert y.tobytes() == results[0][i].tobytes(), (op, rank)
            np.testing.assert_array_equal(y, reduce(stack, axis=0), err_msg=f"{op} on rank {rank}")
