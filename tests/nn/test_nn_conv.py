"""Conv2d, MaxPool2d, AvgPool2d, Flatten: gradient checks over shapes/strides/paddings, torch, errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import AvgPool2d, Conv2d, Flatten, MaxPool2d
from minidist.nn.gradcheck import gradcheck

from .nn_helpers import compare_with_torch


@st.composite
def conv_case(draw, max_channels=3):
    """(N, C, O, kernel, stride, padding, H, W) with the kernel fitting the padded input."""
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    h = draw(st.integers(max(1, kernel[0] - 2 * padding[0]), 6))
    w = draw(st.integers(max(1, kernel[1] - 2 * padding[1]), 6))
    n, c, o = draw(st.integers(1, 2)), draw(st.integers(1, max_channels)), draw(st.integers(1, max_channels))
    return n, c, o, kernel, stride, padding, h, w


@st.composite
def pool_case(draw):
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = draw(st.one_of(st.none(), st.tuples(st.integers(1, 3), st.integers(1, 3))))
    padding = (draw(st.integers(0, kernel[0] // 2)), draw(st.integers(0, kernel[1] // 2)))
    h = draw(st.integers(max(1, kernel[0] - 2 * padding[0]), 7))
    w = draw(st.integers(max(1, kernel[1] - 2 * padding[1]), 7))
    return draw(st.integers(1, 2)), draw(st.integers(1, 3)), kernel, stride, padding, h, w


@pytest.mark.exercise("conv2d_backward")
@given(case=conv_case(), bias=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_conv2d_gradcheck(case, bias, seed):
    n, c, o, kernel, stride, padding, h, w = case
    rng = np.random.default_rng(seed)
    conv = Conv2d(c, o, kernel, stride, padding, bias=bias, rng=rng, dtype=np.float64)
    errors = gradcheck(conv, rng.standard_normal((n, c, h, w)), rng)
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.exercise("conv2d_backward")
@given(case=conv_case(max_channels=4), seed=st.integers(0, 2**32 - 1))
def test_conv2d_matches_torch(case, seed):
    torch = pytest.importorskip("torch")
    n, c, o, kernel, stride, padding, h, w = case
    rng = np.random.default_rng(seed)
    conv = Conv2d(c, o, kernel, stride, padding, rng=rng, dtype=np.float64)
    compare_with_torch(
        conv, torch.nn.Conv2d(c, o, kernel, stride, padding), rng.standard_normal((n, c, h, w)), rng
    )


@pytest.mark.exercise("conv2d_backward")
def test_conv2d_gradients_accumulate(rng):
    conv = Conv2d(2, 3, 3, padding=1, rng=rng, dtype=np.float64)
    x = rng.standard_normal((2, 2, 5, 5))
    dy = rng.standard_normal((2, 3, 5, 5))
    conv.forward(x)
    conv.backward(dy)
    once = conv.weight.grad.copy(), conv.bias.grad.copy()
    conv.forward(x)
    conv.backward(dy)
    np.testing.assert_allclose(conv.weight.grad, 2 * once[0], rtol=1e-12)
    np.testing.assert_allclose(conv.bias.grad, 2 * once[1], rtol=1e-12)


def test_conv2d_without_input_grad_returns_none_and_the_same_parameter_gradients(rng):
    x, dy = rng.standard_normal((2, 2, 5, 5)), rng.standard_normal((2, 3, 3, 3))
    grads = []
    for input_grad in (True, False):
        conv = Conv2d(2, 3, 3, stride=2, padding=1, rng=np.random.default_rng(1), dtype=np.float64,
                      input_grad=input_grad)
        conv.forward(x)
        assert (conv.backward(dy) is None) == (not input_grad)
        grads.append((conv.weight.grad, conv.bias.grad))
    np.testing.assert_array_equal(grads[0][0], grads[1][0])
    np.testing.assert_array_equal(grads[0][1], grads[1][1])


def test_conv2d_shapes_dtype_and_init(rng):
    conv = Conv2d(3, 8, (3, 5), stride=(2, 1), padding=(1, 2), rng=rng)
    assert conv.weight.shape == (8, 3, 3, 5) and conv.bias.shape == (8,)
    assert conv.weight.data.dtype == np.float32
    bound = 1 / np.sqrt(3 * 3 * 5)
    assert np.abs(conv.weight.data).max() <= bound and np.abs(conv.bias.data).max() <= bound
    y = conv(rng.standard_normal((4, 3, 9, 10)).astype(np.float32))
    assert y.shape == (4, 8, 5, 10) == conv.output_shape((4, 3, 9, 10))
    assert y.dtype == np.float32
    assert [name for name, _ in conv.named_parameters()] == ["weight", "bias"]


def test_conv2d_same_seed_same_weights():
    a = Conv2d(2, 4, 3, rng=np.random.default_rng(7))
    b = Conv2d(2, 4, 3, rng=np.random.default_rng(7))
    assert np.array_equal(a.weight.data, b.weight.data) and np.array_equal(a.bias.data, b.bias.data)
    assert len(Conv2d(2, 4, 3, bias=False, rng=np.random.default_rng(7)).parameters()) == 1


@pytest.mark.parametrize("pool_class", [MaxPool2d, AvgPool2d])
@given(case=pool_case(), seed=st.integers(0, 2**32 - 1))
def test_pool_gradcheck(pool_class, case, seed):
    n, c, kernel, stride, padding, h, w = case
    rng = np.random.default_rng(seed)
    pool = pool_class(kernel, stride, padding)
    errors = gradcheck(pool, rng.standard_normal((n, c, h, w)), rng)
    assert errors["input"] < 1e-6, errors


@pytest.mark.parametrize("pool_name", ["MaxPool2d", "AvgPool2d"])
@given(case=pool_case(), seed=st.integers(0, 2**32 - 1))
def test_pool_matches_torch(pool_name, case, seed):
    torch = pytest.importorskip("torch")
    n, c, kernel, stride, padding, h, w = case
    rng = np.random.default_rng(seed)
    mine = {"MaxPool2d": MaxPool2d, "AvgPool2d": AvgPool2d}[pool_name](kernel, stride, padding)
    theirs = getattr(torch.nn, pool_name)(kernel, stride, padding)
    compare_with_torch(mine, theirs, rng.standard_normal((n, c, h, w)), rng)


def test_maxpool_routes_gradient_to_the_maximum():
    x = np.array([[[[1.0, 5.0], [3.0, 2.0]]]])
    pool = MaxPool2d(2)
    assert pool(x).item() == 5.0
    np.testing.assert_array_equal(pool.backward(np.array([[[[7.0]]]])), [[[[0.0, 7.0], [0.0, 0.0]]]])
    tied = MaxPool2d(2)
    tied(np.ones((1, 1, 2, 2)))
    np.testing.assert_array_equal(tied.backward(np.array([[[[7.0]]]])), [[[[7.0, 0.0], [0.0, 0.0]]]])


@pytest.mark.parametrize("size", [4, 5])
def test_maxpool_backward_leaves_pixels_outside_every_window_at_zero(rng, size):
    """Backward writes dx without zeroing it first when the windows tile the input (size 4); with size 5 the
    last row and column are in no window and must come back 0, however often backward runs."""
    pool = MaxPool2d(2)
    for _ in range(3):
        pool(rng.standard_normal((2, 3, size, size)))
        dy = rng.standard_normal((2, 3, 2, 2)) + 10.0
        dx = pool.backward(dy)
        assert np.count_nonzero(dx) == dy.size and np.isclose(dx.sum(), dy.sum())
        assert not dx[:, :, 4:].any() and not dx[:, :, :, 4:].any()


@given(case=pool_case(), seed=st.integers(0, 2**32 - 1))
def test_maxpool_ties_go_to_the_first_maximum_as_in_torch(case, seed):
    """Small integers make ties common: each window's gradient must reach exactly one input, the first
    maximum in row-major order, as PyTorch does."""
    torch = pytest.importorskip("torch")
    n, c, kernel, stride, padding, h, w = case
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 3, (n, c, h, w)).astype(np.float64)
    compare_with_torch(
        MaxPool2d(kernel, stride, padding), torch.nn.MaxPool2d(kernel, stride, padding), x, rng
    )


def test_flatten_round_trip(rng):
    x = rng.standard_normal((2, 3, 4, 5))
    flat = Flatten()
    y = flat(x)
    assert y.shape == (2, 60) and np.array_equal(y, x.reshape(2, 60))
    assert flat.backward(y).shape == x.shape
    assert Flatten(0, 1)(x).shape == (6, 4, 5)
    assert Flatten(2)(x).shape == (2, 3, 20)
    with pytest.raises(ValueError, match="cannot flatten"):
        Flatten(3, 1)(x)


def test_flops_match_torch_flop_counter(rng):
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    conv = Conv2d(3, 5, (3, 2), stride=(2, 1), padding=1, rng=rng)
    shape = (4, 3, 9, 7)
    torch_conv = torch.nn.Conv2d(3, 5, (3, 2), stride=(2, 1), padding=1)
    with FlopCounterMode(display=False) as counter:
        torch_conv(torch.zeros(shape))
    assert conv.flops(shape) == counter.get_total_flops()
    assert MaxPool2d(2).flops((1, 2, 4, 4)) == 2 * 4 * 3
    assert AvgPool2d(2).flops((1, 2, 4, 4)) == 2 * 4 * 4
    assert Flatten().flops(shape) == 0


def test_conv_errors(rng):
    conv = Conv2d(3, 4, 3, rng=rng)
    with pytest.raises(ValueError, match="4 dimensions"):
        conv(np.zeros((3, 5, 5), np.float32))
    with pytest.raises(ValueError, match="expected 3 channels"):
        conv(np.zeros((1, 2, 5, 5), np.float32))
    with pytest.raises(TypeError, match="float"):
        conv(np.zeros((1, 3, 5, 5), np.int64))
    with pytest.raises(TypeError, match="numpy array"):
        conv([[[[0.0]]]])
    with pytest.raises(ValueError, match="larger than the padded input"):
        conv(np.zeros((1, 3, 2, 5), np.float32))
    with pytest.raises(ValueError, match="kernel_size"):
        Conv2d(3, 4, 0)
    with pytest.raises(ValueError, match="stride"):
        Conv2d(3, 4, 3, stride=(1, 0))
    with pytest.raises(ValueError, match="padding"):
        Conv2d(3, 4, 3, padding=-1)
    with pytest.raises(ValueError, match="in_channels"):
        Conv2d(0, 4, 3)
    with pytest.raises(RuntimeError, match="before forward"):
        Conv2d(1, 1, 1).backward(np.zeros((1, 1, 1, 1)))


def test_pool_errors():
    with pytest.raises(ValueError, match="at most half the kernel"):
        MaxPool2d(2, padding=2)
    with pytest.raises(ValueError, match="larger than the padded input"):
        AvgPool2d(3)(np.zeros((1, 1, 2, 2)))
    with pytest.raises(ValueError, match="4 dimensions"):
        MaxPool2d(2)(np.zeros((4, 4)))
    with pytest.raises(TypeError, match="float"):
        MaxPool2d(2)(np.zeros((1, 1, 4, 4), np.int32))
