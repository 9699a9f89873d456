"""The one splitting rule (minidist/collectives/pieces.py) against np.array_split, which it must equal."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.collectives.pieces import split_bounds, split_offsets, split_range, split_sizes


@given(n=st.integers(0, 300), parts=st.integers(1, 40))
def test_split_equals_numpy_array_split(n, parts):
    pieces = np.array_split(np.arange(n), parts)
    assert split_sizes(n, parts) == [len(p) for p in pieces]
    bounds = split_bounds(n, parts)
    offsets = split_offsets(n, parts)
    assert offsets[0] == 0 and offsets[-1] == n and len(offsets) == parts + 1
    for i, piece in enumerate(pieces):
        lo, hi = bounds[i]
        assert (lo, hi) == split_range(n, parts, i) == (offsets[i], offsets[i + 1])
        np.testing.assert_array_equal(np.arange(n)[lo:hi], piece)


@pytest.mark.parametrize("n, parts, index", [(-1, 2, 0), (4, 0, 0), (4, 2, 2), (4, 2, -1), (2.5, 2, 0),
                                             (4, True, 0), (4, 2, 1.0)])
def test_split_refuses_bad_arguments(n, parts, index):
    with pytest.raises(ValueError, match="split"):
        split_range(n, parts, index)
