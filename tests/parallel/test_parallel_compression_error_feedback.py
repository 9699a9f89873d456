"""Error feedback: what was sent plus the residual is every gradient so far."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.parallel.compression import DGC, ErrorFeedback, OneBit, TopK
from tests.parallel.error_feedback_diagnosis import diagnose_error_feedback


@pytest.mark.exercise("error_feedback")
@pytest.mark.diagnose
def test_each_step_sends_the_corrected_gradient_and_keeps_what_it_missed():
    wrong = diagnose_error_feedback(ErrorFeedback)
    assert wrong is None, wrong


@given(n=st.integers(1, 40), steps=st.integers(1, 6), data=st.data())
def test_topk_sent_plus_residual_is_the_sum_of_all_gradients_exactly(n, steps, data):
    k = data.draw(st.integers(1, n))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    ef = ErrorFeedback(TopK(n, k=k, dtype=np.float64))
    grads = rng.integers(-1000, 1000, size=(steps, n)).astype(np.float64)   # sums of these are exact
    sent = np.zeros(n)
    for g in grads:
        sent += ef.decode(ef.compress(g))
    assert np.array_equal(sent + ef.residual, grads.sum(axis=0))


@given(n=st.integers(1, 40), steps=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_one_bit_sent_plus_residual_is_the_sum_of_all_gradients(n, steps, seed):
    rng = np.random.default_rng(seed)
    ef = ErrorFeedback(OneBit([(n,)], dtype=np.float64))
    grads = rng.standard_normal((steps, n))
    sent = np.zeros(n)
    for g in grads:
        sent += ef.decode(ef.compress(g))
    # exact up to float64 rounding of the means (a one-bit value is not a dyadic fraction)
    np.testing.assert_allclose(
        sent + ef.residual, grads.sum(axis=0), rtol=0, atol=1e-12 * steps * (1 + np.abs(grads).max())
    )


def test_without_error_feedback_the_error_is_dropped():
    ef = ErrorFeedback(TopK(4, k=1, dtype=np.float64), enabled=False)
    message = ef.compress(np.array([1.0, 2.0, 3.0, 4.0]))
    assert np.array_equal(ef.decode(message), [0, 0, 0, 4.0]) and not ef.residual.any()


def test_dgc_without_momentum_or_clipping_is_topk_with_error_feedback():
    rng = np.random.default_rng(0)
    dgc = DGC(30, 0.1, momentum=0.0, dtype=np.float64)
    ef = ErrorFeedback(TopK(30, ratio=0.1, dtype=np.float64))
    for _ in range(5):
        g = rng.standard_normal(30)
        assert np.array_equal(dgc.compress(g), ef.compress(g))
    assert np.array_equal(dgc.v, ef.residual)


def test_dgc_momentum_correction_and_clipping():
    dgc = DGC(4, 0.25, momentum=0.5, clip_norm=1.0, world_size=4, dtype=np.float64)
    g = np.array([3.0, 0.0, 4.0, 0.0])                     # norm 5 -> clipped to 1 / sqrt(4) = 0.5
    message = dgc.compress(g)
    assert np.allclose(dgc.decode(message), [0, 0, 0.4, 0])
    assert np.allclose(dgc.u, [0.3, 0, 0, 0]) and np.allclose(dgc.v, [0.3, 0, 0, 0])   # masked where sent
    second = dgc.decode(dgc.compress(np.zeros(4)))     # u = 0.5·0.3, v = 0.3 + 0.15: the delayed entry goes
    assert np.allclose(second, [0.45, 0, 0, 0]) and not dgc.u.any() and not dgc.v.any()


def test_arguments_are_checked():
    with pytest.raises(TypeError, match="encode"):
        ErrorFeedback(object())
    with pytest.raises(ValueError, match="shape"):
        ErrorFeedback(TopK(4, k=1)).compress(np.zeros(5, np.float32))
