"""The magnitude_prune exercise: magnitude_mask on hand-made arrays (no layer, no other exercise)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import magnitude_mask
from tests.nn.pruning_diagnosis import diagnose_magnitude_mask


@pytest.mark.exercise("magnitude_prune")
@pytest.mark.diagnose
def test_the_mask_prunes_round_sparsity_n_of_the_smallest_magnitudes():
    wrong = diagnose_magnitude_mask(magnitude_mask)
    assert wrong is None, wrong


def test_prunes_the_smallest_magnitudes():
    w = np.array([[0.5, -0.1, 2.0], [-3.0, 0.05, -0.4]])
    assert magnitude_mask(w, 0.5).tolist() == [[True, False, True], [True, False, False]]
    assert magnitude_mask(w, 0.0).all()
    # round(4.8) = 5 go
    assert magnitude_mask(w, 0.8).tolist() == [[False, False, False], [True, False, False]]


def test_ties_go_in_index_order():
    w = np.array([1.0, -1.0, 1.0, -1.0, 2.0], dtype=np.float32)
    assert magnitude_mask(w, 0.4).tolist() == [False, False, True, True, True]


@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
       sparsity=st.floats(0.0, 0.99), seed=st.integers(0, 2**32 - 1))
def test_count_and_threshold(shape, sparsity, seed):
    w = np.random.default_rng(seed).standard_normal(shape)
    keep = magnitude_mask(w, sparsity)
    assert keep.shape == w.shape and keep.dtype == bool
    assert np.count_nonzero(~keep) == round(sparsity * w.size)
    if keep.any() and (~keep).any():
        assert np.abs(w[~keep]).max() <= np.abs(w[keep]).min()


def test_bad_sparsity():
    w = np.ones((2, 2))
    for bad in (-0.01, 1.0, 2.0, np.nan):
        with pytest.raises(ValueError, match=r"\[0, 1\)"):
            magnitude_mask(w, bad)
    with pytest.raises(TypeError):
        magnitude_mask(np.ones(3, dtype=int), 0.5)
