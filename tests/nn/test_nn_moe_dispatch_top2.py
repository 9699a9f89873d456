"""Exercise moe_dispatch with two experts per token: every kept (token, choice) lands in its expert's
inputs in slot order, and combine adds gate · output of each kept choice back into the token's row."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn.moe import combine, dispatch
from minidist.nn.moe_router import route

pytestmark = pytest.mark.exercise("moe_dispatch")


@given(n=st.integers(1, 10), e=st.integers(2, 4), factor=st.sampled_from([0.5, 1.0, 2.0]),
       seed=st.integers(0, 1000))
def test_top2_dispatch_and_combine_of_scaled_experts(n, e, factor, seed):
    rng = np.random.default_rng(seed)
    r = route(rng.standard_normal((n, e)), k=2, capacity_factor=factor)
    x = rng.standard_normal((n, 3))
    inputs = dispatch(x, r)
    for expert in range(e):
        tokens, _choices = r.assignments(expert)
        np.testing.assert_array_equal(inputs[expert], x[tokens])
    y = combine([(expert + 2.0) * a for expert, a in enumerate(inputs)], r, n)
    expected = np.zeros_like(x)
    for c in range(2):
        scale = np.where(r.kept[:, c], r.gates[:, c] * (r.experts[:, c] + 2.0), 0.0)
        expected += scale[:, None] * x
    np.testing.assert_allclose(y, expected, rtol=1e-13, atol=1e-15)
