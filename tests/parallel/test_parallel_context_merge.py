"""The online-softmax merge: two partial results over disjoint key sets give the result over their union.

Property test (hypothesis): any split of the keys into two sets, any mask (rows may see no key of one
set, or of both), any scores. The union is computed directly, as softmax(q·kᵀ/√d_k)·v over the keys seen.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn.blockwise_attention import block_attention
from minidist.parallel.context import merge
from tests.parallel.merge_diagnosis import diagnose_merge


@pytest.mark.exercise("online_softmax_merge")
@pytest.mark.diagnose
def test_each_row_merges_the_two_blocks_max_sum_and_weights():
    wrong = diagnose_merge(merge)
    assert wrong is None, wrong


def direct(q, k, v, mask):
    """softmax over the visible keys, written out; rows that see nothing give 0 and lse −∞."""
    s = np.where(mask, q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]), -np.inf)
    m = np.where(mask.any(axis=-1), s.max(axis=-1), 0.0)        # the row maximum keeps exp finite
    total = np.exp(s - m[..., None]).sum(axis=-1)
    with np.errstate(divide="ignore"):
        lse = m + np.log(total)                                # log 0 = −∞ for a row that sees nothing
    p = np.exp(s - m[..., None]) / np.where(total > 0, total, 1.0)[..., None]
    return p @ v, lse


@st.composite
def partials(draw):
    t_q, t_k, d_k = draw(st.integers(1, 5)), draw(st.integers(2, 8)), draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    scale = draw(st.sampled_from([0.1, 1.0, 30.0]))          # large scores test the rescaling
    q, k, v = (scale * rng.standard_normal((2, t, d_k)) for t in (t_q, t_k, t_k))
    side = rng.integers(0, 2, t_k).astype(bool)              # which set each key goes to
    mask = rng.random((t_q, t_k)) < draw(st.sampled_from([0.3, 0.8, 1.0]))
    return q, k, v, side, mask


@given(partials())
def test_merge_of_two_blocks_equals_softmax_over_the_union(case):
    q, k, v, side, mask = case
    first = block_attention(q, k[:, side], v[:, side], mask[:, side])
    second = block_attention(q, k[:, ~side], v[:, ~side], mask[:, ~side])
    out, lse = merge(*first, *second)
    want_out, want_lse = direct(q, k, v, mask)
    np.testing.assert_allclose(out, want_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    seen = ~np.isneginf(want_lse)
    np.testing.assert_allclose(lse[seen], want_lse[seen], rtol=1e-12, atol=1e-12)


@given(partials())
def test_merge_is_symmetric_and_an_empty_partial_changes_nothing(case):
    q, k, v, side, mask = case
    first = block_attention(q, k[:, side], v[:, side], mask[:, side])
    second = block_attention(q, k[:, ~side], v[:, ~side], mask[:, ~side])
    a, b = merge(*first, *second), merge(*second, *first)
    np.testing.assert_allclose(a[0], b[0], rtol=1e-12, atol=1e-14)
    empty = (np.zeros_like(first[0]), np.full_like(first[1], -np.inf))
    out, lse = merge(*first, *empty)
    np.testing.assert_array_equal(out, first[0])
    np.testing.assert_array_equal(lse, first[1])
