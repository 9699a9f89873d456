"""Every layer's backward checks dy before it changes anything (issue 18, items 3 and 4).

A dy whose shape is not exactly the forward output's (wrong batch, transposed, broadcastable, 1-D) must
raise ValueError naming the expected shape, leaving every .grad and every saved tensor bitwise as it was;
a backward before any forward raises RuntimeError.
"""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from minidist import nn


def _tokens(shape, high):
    """An input maker for layers that take integer token ids instead of floats."""
    return lambda rng: rng.integers(0, high, shape)


def _input(spec, rng: np.random.Generator) -> np.ndarray:
    """spec is an input shape (a standard normal float64 input) or a maker rng -> input."""
    return spec(rng) if callable(spec) else rng.standard_normal(spec)


def _cases():
    """name -> (factory(rng) -> layer, input shape or input maker)."""
    return {
        "Linear": (lambda rng: nn.Linear(4, 5, rng=rng, dtype=np.float64), (3, 4)),
        "Linear-no-bias": (lambda rng: nn.Linear(4, 5, bias=False, rng=rng, dtype=np.float64), (3, 4)),
        "Linear-input_grad=False": (lambda rng: nn.Linear(4, 5, rng=rng, dtype=np.float64, input_grad=False),
                                    (4, 4)),
        "Linear-3d": (lambda rng: nn.Linear(4, 3, rng=rng, dtype=np.float64), (2, 3, 4)),
        "Conv2d": (lambda rng: nn.Conv2d(2, 3, 3, padding=1, rng=rng, dtype=np.float64), (2, 2, 5, 4)),
        "MaxPool2d": (lambda rng: nn.MaxPool2d(2), (3, 2, 4, 6)),
        "AvgPool2d": (lambda rng: nn.AvgPool2d(2, padding=1), (3, 2, 4, 6)),
        "Flatten": (lambda rng: nn.Flatten(), (4, 2, 2)),
        "ReLU": (lambda rng: nn.ReLU(), (4, 4)),
        "Tanh": (lambda rng: nn.Tanh(), (4, 4)),
        "Sigmoid": (lambda rng: nn.Sigmoid(), (4, 4)),
        "GELU": (lambda rng: nn.GELU(), (4, 4)),
        "GELU-tanh": (lambda rng: nn.GELU(approximate="tanh"), (4, 4)),
        "Dropout": (lambda rng: nn.Dropout(0.5, rng=rng), (4, 4)),
        "Dropout-eval": (lambda rng: nn.Dropout(0.5, rng=rng).eval(), (4, 4)),
        "BatchNorm1d": (lambda rng: nn.BatchNorm1d(4, dtype=np.float64), (4, 4)),
        "BatchNorm1d-eval": (lambda rng: nn.BatchNorm1d(4, dtype=np.float64).eval(), (4, 4)),
        "BatchNorm2d": (lambda rng: nn.BatchNorm2d(2, dtype=np.float64), (3, 2, 3, 3)),
        "LayerNorm": (lambda rng: nn.LayerNorm(4, dtype=np.float64), (4, 4)),
        "GroupNorm": (lambda rng: nn.GroupNorm(2, 4, dtype=np.float64), (3, 4, 2)),
        "OnlineNorm": (lambda rng: nn.OnlineNorm(2, alpha_fwd=0.9, dtype=np.float64), (3, 2, 3)),
        "Sequential": (lambda rng: nn.Sequential(nn.Linear(4, 6, rng=rng, dtype=np.float64), nn.ReLU(),
                                                 nn.Linear(6, 4, rng=rng, dtype=np.float64)), (4, 4)),
        "Masked": (lambda rng: _pruned(nn.Masked(nn.Linear(4, 5, rng=rng, dtype=np.float64))), (3, 4)),
        "MoE": (lambda rng: nn.MoE(4, 6, 3, k=1, capacity_factor=0.75, rng=rng, dtype=np.float64), (8, 4)),
        "MoE-top2-3d": (lambda rng: nn.MoE(4, 5, 3, k=2, z_loss_coef=0.1, groups=2, rng=rng,
                                           dtype=np.float64), (2, 3, 4)),
        "SwitchTransformer": (lambda rng: nn.SwitchTransformer(6, 4, 1, 4, 2, 2, d_ff=5, capacity_factor=0.75,
                                                               rng=rng, dtype=np.float64),
                              _tokens((2, 3), 6)),
        "RNN": (lambda rng: nn.RNN(3, 4, rng=rng, dtype=np.float64), (5, 2, 3)),
        "RNN-relu-batch_first": (lambda rng: nn.RNN(3, 4, nonlinearity="relu", batch_first=True, rng=rng,
                                                    dtype=np.float64), (2, 5, 3)),
        "LSTM": (lambda rng: nn.LSTM(3, 4, rng=rng, dtype=np.float64), (5, 2, 3)),
        "LSTM-batch_first": (lambda rng: nn.LSTM(3, 4, batch_first=True, rng=rng, dtype=np.float64),
                             (2, 5, 3)),
        "GRU-2-layers": (lambda rng: nn.GRU(3, 4, num_layers=2, rng=rng, dtype=np.float64), (5, 2, 3)),
        "InstanceNorm2d": (lambda rng: nn.InstanceNorm2d(2, affine=True, dtype=np.float64), (3, 2, 3, 3)),
        "BatchRenorm2d": (lambda rng: nn.BatchRenorm2d(2, dtype=np.float64), (3, 2, 3, 3)),
        "WeightNorm": (lambda rng: nn.WeightNorm(nn.Linear(4, 3, rng=rng, dtype=np.float64)), (5, 4)),
        "Checkpoint": (lambda rng: nn.Checkpoint(nn.Sequential(
            nn.Linear(4, 4, rng=rng, dtype=np.float64), nn.Dropout(0.3, rng=rng), nn.Tanh())), (5, 4)),
        "Softmax": (lambda rng: nn.Softmax(), (3, 5)),
        "Softmax-dim0": (lambda rng: nn.Softmax(dim=0), (3, 2, 4)),
        "Embedding": (lambda rng: nn.Embedding(7, 3, rng=rng, dtype=np.float64), _tokens((2, 5), 7)),
        "CausalSelfAttention": (lambda rng: nn.CausalSelfAttention(4, 2, rng=rng, dtype=np.float64),
                                (2, 3, 4)),
        "CausalSelfAttention-dropout": (lambda rng: nn.CausalSelfAttention(4, 2, dropout=0.2, rng=rng,
                                                                           dtype=np.float64), (2, 3, 4)),
        "GPT": (lambda rng: nn.GPT(6, 4, 1, 4, 2, dropout=0.1, rng=rng, dtype=np.float64),
                _tokens((2, 3), 6)),
        "GPT-tied": (lambda rng: nn.GPT(6, 4, 1, 4, 2, tie_weights=True, rng=rng, dtype=np.float64),
                     _tokens((2, 4), 6)),
        "TransformerBlock": (lambda rng: nn.TransformerBlock(4, 2, dropout=0.1, rng=rng, dtype=np.float64),
                             (2, 3, 4)),
    }


def _pruned(layer):
    layer.prune_to(0.5)
    return layer


CASES = _cases()


def test_every_nn_layer_has_a_case():
    layer_types = {type(factory(np.random.default_rng(0))) for factory, _ in CASES.values()}
    exported = {getattr(nn, name) for name in nn.__all__}
    missing = sorted(c.__name__ for c in exported if isinstance(c, type) and issubclass(c, nn.Module)
                     and c is not nn.Module and c not in layer_types)
    assert not missing, f"add these layers to tests/nn/test_nn_upstream.py: {missing}"


def _wrong_shapes(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Shapes a careless caller might pass for a dy of ``shape``; none of them equals shape."""
    candidates = [(shape[0] + 1, *shape[1:]), (max(shape[0] - 1, 1), *shape[1:]), tuple(reversed(shape)),
                  (1, *shape[1:]), (shape[-1],), (int(np.prod(shape)),), (*shape, 1), shape[1:]]
    return list(dict.fromkeys(s for s in candidates if s != shape and len(s) > 0))


def _snapshot(layer: nn.Module) -> list:
    """Every attribute of every sub-module: arrays and Parameters as bytes, generators by state, the rest
    by identity (a dropped cache shows up as a different object)."""
    out = []
    for module in layer.modules():
        for name, value in sorted(vars(module).items()):
            if isinstance(value, nn.Parameter):
                out.append((name, value.data.tobytes(), value.grad.tobytes()))
            elif isinstance(value, np.ndarray):
                out.append((name, id(value), value.dtype, value.shape, value.tobytes()))
            elif isinstance(value, np.random.Generator):
                out.append((name, repr(value.bit_generator.state)))
            else:
                out.append((name, id(value)))
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_nn_backward_refuses_wrong_dy_before_changing_anything(case):
    rng = np.random.default_rng(7)
    factory, x_shape = CASES[case]
    layer = factory(rng)
    for p in layer.parameters():
        p.grad[...] = rng.standard_normal(p.shape)  # non-zero, so that any addition would show
    y = layer.forward(_input(x_shape, rng))
    y = y[0] if isinstance(y, tuple) else y          # the recurrent layers return (output, final state)
    twin = copy.deepcopy(layer)
    before = _snapshot(layer)
    for shape in _wrong_shapes(y.shape):
        with pytest.raises(ValueError, match=r"expected dy of shape " + re.escape(str(tuple(y.shape)))):
            layer.backward(np.ones(shape))
        assert _snapshot(layer) == before, f"dy of shape {shape} changed the layer's state"
    with pytest.raises(TypeError):
        layer.backward(np.ones(y.shape, dtype=np.int64))
    with pytest.raises(TypeError):
        layer.backward(np.ones(y.shape).tolist())
    assert _snapshot(layer) == before
    # the refused calls left the layer able to do its real backward, bitwise as an untouched copy does
    dy = rng.standard_normal(y.shape)
    dx, dx_twin = layer.backward(dy), twin.backward(dy)
    assert (dx is None and dx_twin is None) or np.array_equal(dx, dx_twin)
    for p, q in zip(layer.parameters(), twin.parameters(), strict=True):
        assert np.array_equal(p.grad, q.grad)


@pytest.mark.parametrize("case", sorted(CASES))
def test_nn_backward_before_forward_is_a_clear_runtime_error(case):
    rng = np.random.default_rng(3)
    factory, x_shape = CASES[case]
    layer = factory(rng)
    with pytest.raises(RuntimeError, match="backward called before forward"):
        layer.backward(np.ones(_input(x_shape, rng).shape))
    assert all(not p.grad.any() for p in layer.parameters())


def test_nn_linear_transposed_dy_is_refused_without_input_grad():
    """Issue 18's example: with input_grad=False a transposed dy used to give a wrong weight.grad."""
    layer = nn.Linear(3, 5, rng=np.random.default_rng(0), dtype=np.float64, input_grad=False)
    layer.forward(np.ones((4, 3)))
    with pytest.raises(ValueError, match=r"expected dy of shape \(4, 5\)"):
        layer.backward(np.ones((5, 4)))
    assert not layer.weight.grad.any() and not layer.bias.grad.any()
