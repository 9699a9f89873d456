"""Exercise systolic_tile_schedule: the fewest tiles that cover the weight, full k × k tiles wherever they
fit, each starting on the k-grid (what the closed-form cycle count ⌈K/k⌉·⌈M/k⌉·(n + 2(k − 1)) assumes)."""

import math

import pytest

from minidist.hardware.systolic import tile_schedule
from tests.hardware.systolic_diagnosis import diagnose_tile_schedule


@pytest.mark.exercise("systolic_tile_schedule")
@pytest.mark.diagnose
def test_every_tick_loads_a_grid_tile_and_every_weight_once():
    wrong = diagnose_tile_schedule(tile_schedule)
    assert wrong is None, wrong


@pytest.mark.exercise("systolic_tile_schedule")
@pytest.mark.parametrize("K, M, k", [(1, 1, 1), (5, 3, 2), (8, 8, 4), (7, 9, 3), (3, 10, 16), (16, 5, 1)])
def test_fewest_tiles_full_where_they_fit_and_on_the_grid(K, M, k):
    tiles = tile_schedule(K, M, k)
    assert len(tiles) == math.ceil(K / k) * math.ceil(M / k)
    sizes = [(rows.stop - rows.start, cols.stop - cols.start) for rows, cols in tiles]
    assert sizes.count((k, k)) == (K // k) * (M // k)
    assert all(rows.start % k == 0 and cols.start % k == 0 for rows, cols in tiles)
    assert {(rows.start, cols.start) for rows, cols in tiles} == {
        (r, c) for r in range(0, K, k) for c in range(0, M, k)}
