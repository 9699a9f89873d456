"""Exercise moe_dispatch: top-1 dispatch and combine on routings small enough to check by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn.moe import combine, dispatch
from minidist.nn.moe_router import route
from tests.nn.moe_dispatch_diagnosis import diagnose_moe_dispatch

pytestmark = pytest.mark.exercise("moe_dispatch")


@pytest.mark.diagnose
def test_each_expert_slot_holds_its_token_and_each_token_row_gets_its_gated_outputs():
    wrong = diagnose_moe_dispatch(dispatch, combine)
    assert wrong is None, wrong


def test_dispatch_gathers_each_experts_kept_tokens_in_slot_order():
    # tokens 0, 2, 3 prefer expert 1; token 1 expert 0; capacity ceil(1.0 · 4 / 2) = 2 drops token 3
    logits = np.array([[0.0, 2.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
    r = route(logits, k=1, capacity_factor=1.0)
    x = np.arange(8.0).reshape(4, 2)
    inputs = dispatch(x, r)
    np.testing.assert_array_equal(inputs[0], x[[1]])
    np.testing.assert_array_equal(inputs[1], x[[0, 2]])
    y = combine([2 * inputs[0], 10 * inputs[1]], r, 4)
    gate = r.gates[:, 0]
    np.testing.assert_allclose(y, [10 * gate[0] * x[0], 2 * gate[1] * x[1], 10 * gate[2] * x[2], [0, 0]])


@given(n=st.integers(1, 12), e=st.integers(1, 4), factor=st.sampled_from([0.5, 1.0, 2.0]),
       seed=st.integers(0, 1000))
def test_top1_combine_of_dispatch_scales_each_kept_token_by_its_gate(n, e, factor, seed):
    rng = np.random.default_rng(seed)
    r = route(rng.standard_normal((n, e)), k=1, capacity_factor=factor)
    x = rng.standard_normal((n, 3))
    inputs = dispatch(x, r)
    assert [len(a) for a in inputs] == list(r.tokens_per_expert())
    assert all(len(a) <= r.capacity for a in inputs)
    y = combine(inputs, r, n)  # experts that are the identity
    expected = np.where(r.kept[:, :1], r.gates[:, :1] * x, 0.0)
    np.testing.assert_allclose(y, expected, rtol=0, atol=1e-15)
