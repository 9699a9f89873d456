"""Linear and the Module machinery: gradient checks, torch, parameter order, state_dict, zero_grad,
gradient accumulation, train/eval, errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import BatchNorm1d, Dropout, Linear, Module, Parameter, ReLU, Sequential
from minidist.nn.gradcheck import gradcheck

from .nn_helpers import compare_with_torch

seeds = st.integers(0, 2**32 - 1)


@pytest.mark.exercise("linear")
@given(leading=st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple), n_in=st.integers(1, 5),
       n_out=st.integers(1, 5), bias=st.booleans(), seed=seeds)
def test_linear_gradcheck(leading, n_in, n_out, bias, seed):
    rng = np.random.default_rng(seed)
    layer = Linear(n_in, n_out, bias=bias, rng=rng, dtype=np.float64)
    errors = gradcheck(layer, rng.standard_normal((*leading, n_in)), rng)
    assert max(errors.values()) < 1e-6, errors


@pytest.mark.exercise("linear")
@given(n=st.integers(1, 6), n_in=st.integers(1, 6), n_out=st.integers(1, 6), bias=st.booleans(), seed=seeds)
def test_linear_matches_torch(n, n_in, n_out, bias, seed):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    layer = Linear(n_in, n_out, bias=bias, rng=rng, dtype=np.float64)
    compare_with_torch(layer, torch.nn.Linear(n_in, n_out, bias=bias), rng.standard_normal((n, n_in)), rng)


@pytest.mark.exercise("linear")
def test_linear_by_hand():
    layer = Linear(2, 1, dtype=np.float64)
    layer.weight.data[...] = [[2.0, -1.0]]
    layer.bias.data[...] = [0.5]
    x = np.array([[1.0, 3.0], [0.0, 1.0]])
    np.testing.assert_array_equal(layer(x), [[-0.5], [-0.5]])                # y = x·Wᵀ + b
    # dy·W
    np.testing.assert_array_equal(layer.backward(np.array([[1.0], [2.0]])), [[2.0, -1.0], [4.0, -2.0]])
    np.testing.assert_array_equal(layer.weight.grad, [[1.0, 5.0]])           # dyᵀ·x
    np.testing.assert_array_equal(layer.bias.grad, [3.0])                    # Σ dy


@pytest.mark.exercise("linear")
def test_linear_without_input_grad_returns_none_and_the_same_parameter_gradients(rng):
    x, dy = rng.standard_normal((5, 4)), rng.standard_normal((5, 3))
    grads = []
    for input_grad in (True, False):
        layer = Linear(4, 3, rng=np.random.default_rng(1), dtype=np.float64, input_grad=input_grad)
        layer.forward(x)
        dx = layer.backward(dy)
        assert (dx is None) == (not input_grad)
        grads.append((layer.weight.grad.copy(), layer.bias.grad.copy()))
    assert all(np.array_equal(a, b) for a, b in zip(*grads, strict=True))


def test_gradients_accumulate_and_zero_grad_clears(rng):
    model = Sequential(
        Linear(3, 4, rng=rng, dtype=np.float64), ReLU(), Linear(4, 2, rng=rng, dtype=np.float64)
    )
    x, dy = rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    model.forward(x)
    model.backward(dy)
    once = [p.grad.copy() for p in model.parameters()]
    model.forward(x)
    model.backward(dy)
    for p, g in zip(model.parameters(), once, strict=True):
        np.testing.assert_allclose(p.grad, 2 * g, rtol=1e-12)
    # two micro-batches accumulate to the gradient of the whole batch (sum of per-sample contributions)
    model.zero_grad()
    assert all(not p.grad.any() for p in model.parameters())
    model.forward(x[:2])
    model.backward(dy[:2])
    model.forward(x[2:])
    model.backward(dy[2:])
    for p, g in zip(model.parameters(), once, strict=True):
        np.testing.assert_allclose(p.grad, g, rtol=1e-10, atol=1e-14)


def test_parameters_have_a_fixed_order_and_names(rng):
    model = Sequential(Linear(3, 4, rng=rng), ReLU(), BatchNorm1d(4), Linear(4, 2, bias=False, rng=rng))
    names = [name for name, _ in model.named_parameters()]
    assert names == [
        "layers.0.weight",
        "layers.0.bias",
        "layers.2.weight",
        "layers.2.bias",
        "layers.3.weight",
    ]
    assert [p.shape for p in model.parameters()] == [(4, 3), (4,), (4,), (4,), (2, 4)]
    assert model.parameters()[0] is model[0].weight and model.parameters()[-1] is model[3].weight
    assert [name for name, _ in model.named_buffers()] == ["layers.2.running_mean", "layers.2.running_var"]
    assert model.num_parameters() == 12 + 4 + 4 + 4 + 8


@pytest.mark.exercise("linear")
def test_state_dict_round_trip(rng):
    def make(seed):
        r = np.random.default_rng(seed)
        return Sequential(Linear(3, 4, rng=r), BatchNorm1d(4), ReLU(), Linear(4, 2, rng=r))

    source, target = make(1), make(2)
    source.forward(rng.standard_normal((6, 3)).astype(np.float32))  # moves the running statistics
    state = source.state_dict()
    assert set(state) == {"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
                          "layers.1.running_mean", "layers.1.running_var", "layers.3.weight", "layers.3.bias"}
    target.load_state_dict(state)
    for key, value in target.state_dict().items():
        np.testing.assert_array_equal(value, state[key])
    state["layers.0.weight"][...] = 99  # a state_dict holds copies, not the live arrays
    assert not (source[0].weight.data == 99).any()
    x = rng.standard_normal((5, 3)).astype(np.float32)
    source.eval()
    target.eval()
    np.testing.assert_array_equal(source(x), target(x))
    with pytest.raises(ValueError, match="missing"):
        target.load_state_dict({k: v for k, v in state.items() if k != "layers.3.bias"})
    with pytest.raises(ValueError, match="expected shape"):
        target.load_state_dict({**state, "layers.3.bias": np.zeros(3)})


def test_train_eval_reach_every_submodule(rng):
    model = Sequential(Linear(2, 2, rng=rng), Sequential(Dropout(0.5, rng=rng), BatchNorm1d(2)))
    model.eval()
    assert not any(m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())


def test_linear_init_dtype_flops_and_seed():
    a = Linear(16, 8, rng=np.random.default_rng(3))
    b = Linear(16, 8, rng=np.random.default_rng(3))
    assert np.array_equal(a.weight.data, b.weight.data) and a.weight.data.dtype == np.float32
    assert np.abs(a.weight.data).max() <= 0.25 and a.weight.shape == (8, 16)
    assert a.flops((32, 16)) == 2 * 32 * 16 * 8 and a.flops((4, 5, 16)) == 2 * 20 * 16 * 8


def test_linear_flops_match_torch_flop_counter(rng):
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        torch.nn.Linear(16, 8)(torch.zeros(32, 16))
    assert Linear(16, 8, rng=rng).flops((32, 16)) == counter.get_total_flops()


def test_linear_and_module_errors(rng):
    layer = Linear(3, 2, rng=rng)
    with pytest.raises(ValueError, match=r"\(\.\.\., 3\)"):
        layer(np.zeros((4, 5), np.float32))
    with pytest.raises(TypeError, match="float"):
        layer(np.zeros((4, 3), np.int32))
    with pytest.raises(RuntimeError, match="before forward"):
        Linear(3, 2, rng=rng).backward(np.zeros((1, 2)))
    with pytest.raises(ValueError, match=r"\(\.\.\., 3\)"):
        layer.flops((4, 5))
    with pytest.raises(ValueError, match=">= 1"):
        Linear(0, 2)
    with pytest.raises(TypeError, match="Generator"):
        Linear(3, 2, rng=0)
    with pytest.raises(TypeError, match="Modules"):
        Sequential(Linear(3, 2, rng=rng), np.tanh)
    with pytest.raises(TypeError, match="float16/32/64"):
        Parameter(np.zeros(3, dtype=np.int64))
    with pytest.raises(TypeError, match="does not define forward"):
        Module()(np.zeros(1))
