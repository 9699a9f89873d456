"""sum_partial_gradients / sum_gradients: every gradient partial over a group becomes the sum over that
group's ranks, bitwise the same on each (integer-valued data: exact sums), one flat all-reduce per group;
over two orthogonal groups (a grid's rows and columns) the sum over both is the sum over all ranks;
gradients with no partial_over are left alone."""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.collectives import sum_gradients, sum_partial_gradients
from minidist.nn import Parameter


def _grads(rank):
    rng = np.random.default_rng(rank)
    return [rng.integers(-9, 10, shape).astype(np.float64) for shape in ((3, 2), (5,), (2, 2), (4,))]


def _worker(comm, width, algorithm):
    """Ranks on a grid of rows of ``width``: row group = same row, column group = same column."""
    row, col = divmod(comm.rank, width)
    rows, cols = comm.split(row, key=col), comm.split(col, key=row)
    params = [Parameter(np.zeros_like(g)) for g in _grads(comm.rank)]
    for p, g in zip(params, _grads(comm.rank), strict=True):
        p.grad[...] = g
    params[0].partial_over.append(comm)
    params[1].partial_over += [rows, cols]
    params[2].partial_over.append(cols)
    sum_partial_gradients(params, algorithm)
    return [p.grad for p in params]


@pytest.mark.parametrize("world,width", [(1, 1), (2, 2), (3, 1), (4, 2), (6, 3)])
@pytest.mark.parametrize("algorithm", ["pairwise", "ring"])
def test_partial_gradients_become_the_sums_over_their_groups(world, width, algorithm):
    every = [_grads(r) for r in range(world)]
    for rank, grads in enumerate(run(_worker, world, width, algorithm)):
        np.testing.assert_array_equal(grads[0], sum(g[0] for g in every))
        np.testing.assert_array_equal(grads[1], sum(g[1] for g in every))         # rows, then columns
        column = [every[q][2] for q in range(world) if q % width == rank % width]
        np.testing.assert_array_equal(grads[2], sum(column))
        np.testing.assert_array_equal(grads[3], every[rank][3])                    # not partial: untouched


def test_sum_gradients_of_nothing_or_one_rank_sends_nothing():
    def worker(comm):
        p = Parameter(np.ones(3))
        p.grad[...] = comm.rank + 1
        before = comm.stats.messages_sent
        sum_gradients(comm, [], "ring")
        sum_gradients(comm.split(comm.rank, key=0), [p])        # a group of one rank
        return comm.stats.messages_sent - before, p.grad[0]
    assert run(worker, 2) == [(0, 1.0), (0, 2.0)]
