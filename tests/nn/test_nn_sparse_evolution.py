"""SET's rewiring: the density stays, the smallest active weights go, as many new connections come from
the inactive ones (at 0), reproducibly from the rng."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.nn import Linear, Masked
from minidist.nn.pruning import magnitude_mask
from minidist.nn.sparse_evolution import set_rewire


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 8), cols=st.integers(2, 8), sparsity=st.floats(0.1, 0.9), fraction=st.floats(0, 1),
       seed=st.integers(0, 2**16))
def test_set_rewire_keeps_the_density_and_drops_the_smallest(rows, cols, sparsity, fraction, seed):
    layer = Masked(Linear(cols, rows, rng=np.random.default_rng(seed), dtype=np.float64))
    layer.set_masks(magnitude_mask(layer.layer.weight.data, sparsity))
    before_mask, before_w = layer.weight_mask.copy(), layer.layer.weight.data.copy()
    dropped, grown = set_rewire(layer, fraction, np.random.default_rng(seed))
    after = layer.weight_mask
    assert after.sum() == before_mask.sum() and len(dropped) == len(grown)
    assert not before_mask.ravel()[grown].any() and before_mask.ravel()[dropped].all()   # inactive -> active
    assert not after.ravel()[dropped].any() and after.ravel()[grown].all()
    kept = before_mask.ravel() & after.ravel()
    if len(dropped) and kept.any():   # every dropped weight was no larger than every kept one
        assert np.abs(before_w.ravel()[dropped]).max() <= np.abs(before_w.ravel()[kept]).min()
    weight = layer.layer.weight.data
    assert (weight.ravel()[grown] == 0).all() and (weight[~after] == 0).all()
    twin = Masked(Linear(cols, rows, rng=np.random.default_rng(seed), dtype=np.float64))
    twin.set_masks(before_mask)
    set_rewire(twin, fraction, np.random.default_rng(seed))
    assert np.array_equal(twin.weight_mask, after)                                     # reproducible


def test_set_rewire_refuses_bad_input():
    layer = Masked(Linear(3, 2, rng=np.random.default_rng(0)))
    with pytest.raises(TypeError, match="Masked"):
        set_rewire(Linear(3, 2, rng=np.random.default_rng(0)), 0.1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="fraction"):
        set_rewire(layer, 1.5, np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        set_rewire(layer, 0.1, None)
