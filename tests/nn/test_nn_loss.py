"""CrossEntropyLoss and MSELoss: gradient checks, torch, extreme logits, errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import CrossEntropyLoss, MSELoss
from minidist.nn.gradcheck import gradcheck_loss

seeds = st.integers(0, 2**32 - 1)


@pytest.mark.exercise("cross_entropy_backward")
@given(n=st.integers(1, 6), classes=st.integers(1, 6), scale=st.sampled_from([0.1, 1.0, 3.0]), seed=seeds)
def test_cross_entropy_gradcheck(n, classes, scale, seed):
    """Logit gaps stay below ~25: beyond, 1 − softmax rounds to 0 in float64 and every gradient is ~1e-11
    or smaller, too small for finite differences to say anything."""
    rng = np.random.default_rng(seed)
    logits = scale * rng.standard_normal((n, classes))
    target = rng.integers(0, classes, n)
    assert gradcheck_loss(CrossEntropyLoss(), logits, target) < 1e-6


@pytest.mark.exercise("cross_entropy_backward")
@given(n=st.integers(1, 6), classes=st.integers(1, 6), seed=seeds)
def test_cross_entropy_matches_torch(n, classes, seed):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    logits = 4 * rng.standard_normal((n, classes))
    target = rng.integers(0, classes, n)
    loss_fn = CrossEntropyLoss()
    loss = loss_fn(logits, target)
    tl = torch.tensor(logits, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(tl, torch.from_numpy(target))
    expected.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-12, abs=1e-14)
    np.testing.assert_allclose(loss_fn.backward(), tl.grad.numpy(), rtol=1e-10, atol=1e-14)


@pytest.mark.exercise("cross_entropy_backward")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_extreme_logits_stay_finite(dtype):
    logits = np.array([[1000.0, -1000.0, 0.0], [-1000.0, -1000.0, -1000.0], [1000.0, 1000.0, -1000.0]], dtype)
    target = np.array([1, 2, 0])
    loss_fn = CrossEntropyLoss()
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        loss = loss_fn(logits, target)
        grad = loss_fn.backward()
    # row 0: −log p(class 1) = 2000; row 1: log 3; row 2: log 2
    assert loss == pytest.approx((2000 + np.log(3) + np.log(2)) / 3, rel=1e-6)
    assert np.isfinite(grad).all() and grad.dtype == dtype
    np.testing.assert_allclose(grad.sum(axis=1), 0, atol=1e-6)  # softmax − onehot sums to 0 per row
    np.testing.assert_allclose(grad[0], np.array([1, -1, 0]) / 3, atol=1e-7)


def test_cross_entropy_errors():
    loss_fn = CrossEntropyLoss()
    logits = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\)"):
        loss_fn(logits, np.array([0, 4, 1]))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\)"):
        loss_fn(logits, np.array([0, -1, 1]))
    with pytest.raises(TypeError, match="integer class labels"):
        loss_fn(logits, np.array([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match=r"expected shape \(3,\)"):
        loss_fn(logits, np.array([0, 1]))
    with pytest.raises(ValueError, match="2 or 3 dimensions"):
        loss_fn(np.zeros(4, np.float32), np.array([0]))
    with pytest.raises(TypeError, match="float"):
        loss_fn(np.zeros((3, 4), np.int64), np.array([0, 1, 2]))
    with pytest.raises(RuntimeError, match="before forward"):
        CrossEntropyLoss().backward()
    with pytest.raises(ValueError, match=r"expected shape \(2, 3\)"):
        loss_fn(np.zeros((2, 3, 4)), np.zeros((3, 2), np.int64))


@pytest.mark.exercise("cross_entropy_backward")
@given(b=st.integers(1, 3), t=st.integers(1, 4), classes=st.integers(1, 5), seed=seeds)
def test_cross_entropy_sequence_logits_match_torch_and_differences(b, t, classes, seed):
    """(B, T, C) logits with (B, T) targets: the mean over all B·T positions, as torch computes it."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    logits = 3 * rng.standard_normal((b, t, classes))
    target = rng.integers(0, classes, (b, t))
    loss_fn = CrossEntropyLoss()
    loss = loss_fn(logits, target)
    dlogits = loss_fn.backward()
    assert dlogits.shape == logits.shape
    tl = torch.tensor(logits, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(tl.reshape(-1, classes),
                                                 torch.from_numpy(target).reshape(-1))
    expected.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-12, abs=1e-14)
    np.testing.assert_allclose(dlogits, tl.grad.numpy(), rtol=1e-10, atol=1e-14)
    assert gradcheck_loss(CrossEntropyLoss(), logits, target) < 1e-6


@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), seed=seeds)
def test_mse_gradcheck_and_torch(shape, seed):
    rng = np.random.default_rng(seed)
    prediction, target = rng.standard_normal(shape), rng.standard_normal(shape)
    assert gradcheck_loss(MSELoss(), prediction, target) < 1e-6
    torch = pytest.importorskip("torch")
    loss_fn = MSELoss()
    tp = torch.tensor(prediction, requires_grad=True)
    expected = torch.nn.functional.mse_loss(tp, torch.from_numpy(target))
    expected.backward()
    assert loss_fn(prediction, target) == pytest.approx(expected.item(), rel=1e-12)
    np.testing.assert_allclose(loss_fn.backward(), tp.grad.numpy(), rtol=1e-12)


def test_mse_errors():
    with pytest.raises(ValueError, match="differ in shape"):
        MSELoss()(np.zeros((2, 3)), np.zeros((3, 2)))
    with pytest.raises(TypeError, match="float"):
        MSELoss()(np.zeros(3, np.int64), np.zeros(3))
    with pytest.raises(ValueError, match="empty"):
        MSELoss()(np.zeros(0), np.zeros(0))
