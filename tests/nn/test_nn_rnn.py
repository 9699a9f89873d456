"""nn.RNN and nn.LSTM: backpropagation through time against finite differences and PyTorch (float64)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import nn
from minidist.gradcheck import gradcheck, numerical_gradient, relative_error
from minidist.nn.rnn import lstm_cell_backward, lstm_cell_forward

NAMES = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")


def _layer(kind, input_size, hidden, rng, **kw):
    return getattr(nn, kind)(input_size, hidden, rng=rng, dtype=np.float64, **kw)


@pytest.mark.parametrize("kind,kw", [("RNN", {}), ("RNN", {"nonlinearity": "relu"}), ("LSTM", {}),
                                     ("LSTM", {"batch_first": True}), ("RNN", {"bias": False})])
def test_rnn_gradients_match_finite_differences(kind, kw):
    rng = np.random.default_rng(0)
    layer = _layer(kind, 3, 4, rng, **kw)
    errors = gradcheck(layer, rng.standard_normal((2, 5, 3) if kw.get("batch_first") else (5, 2, 3)), rng)
    assert max(errors.values()) < 1e-6, errors


def test_lstm_cell_backward_matches_finite_differences():
    """The exercise's function alone: dgates and dc_prev of L = Σ gh ⊙ h + Σ gc ⊙ c."""
    rng = np.random.default_rng(1)
    gates, c_prev = rng.standard_normal((3, 8)), rng.standard_normal((3, 2))
    gh, gc = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))

    def loss():
        h, c, _ = lstm_cell_forward(gates, c_prev)
        return float(np.sum(gh * h) + np.sum(gc * c))

    dgates, dc_prev = lstm_cell_backward(gh, gc, lstm_cell_forward(gates, c_prev)[2])
    assert dgates.shape == (3, 8) and dc_prev.shape == (3, 2)
    assert relative_error(dgates, numerical_gradient(loss, gates)) < 1e-7
    assert relative_error(dc_prev, numerical_gradient(loss, c_prev)) < 1e-7


@given(kind=st.sampled_from(["RNN", "LSTM"]), steps=st.integers(1, 5), batch=st.integers(1, 3),
       input_size=st.integers(1, 4), hidden=st.integers(1, 5), batch_first=st.booleans(),
       with_state=st.booleans(), seed=st.integers(0, 2**16))
def test_rnn_equals_torch_autograd_float64(kind, steps, batch, input_size, hidden, batch_first, with_state,
                                           seed):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    ours = _layer(kind, input_size, hidden, rng, batch_first=batch_first)
    ref = getattr(torch.nn, kind)(input_size, hidden, batch_first=batch_first).double()
    with torch.no_grad():
        for name in NAMES:
            getattr(ref, name).copy_(torch.from_numpy(getattr(ours, name).data))
    x = rng.standard_normal((batch, steps, input_size) if batch_first else (steps, batch, input_size))
    state = [rng.standard_normal((1, batch, hidden)) for _ in range(2 if kind == "LSTM" else 1)]
    y = ours.forward(x, (tuple(state) if kind == "LSTM" else state[0]) if with_state else None)
    dy = rng.standard_normal(y.shape)
    dx = ours.backward(dy)

    xt = torch.from_numpy(x).requires_grad_()
    st_t = [torch.from_numpy(s).requires_grad_() for s in state]
    hx = (tuple(st_t) if kind == "LSTM" else st_t[0]) if with_state else None
    yt, final = ref(xt, hx)
    (yt * torch.from_numpy(dy)).sum().backward()
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    for name in NAMES:
        np.testing.assert_allclose(getattr(ours, name).grad, getattr(ref, name).grad.numpy(), rtol=1e-10,
                                   atol=1e-12)
    h_n = final[0] if kind == "LSTM" else final
    np.testing.assert_allclose(ours.h_n, h_n.detach().numpy(), rtol=1e-12, atol=1e-12)
    if kind == "LSTM":
        np.testing.assert_allclose(ours.c_n, final[1].detach().numpy(), rtol=1e-12, atol=1e-12)
    if with_state:
        np.testing.assert_allclose(ours.dh0, st_t[0].grad.numpy(), rtol=1e-10, atol=1e-12)
        if kind == "LSTM":
            np.testing.assert_allclose(ours.dc0, st_t[1].grad.numpy(), rtol=1e-10, atol=1e-12)


def test_rnn_parameters_have_torch_names_order_and_shapes():
    lstm = nn.LSTM(3, 5, rng=np.random.default_rng(0))
    assert [n for n, _ in lstm.named_parameters()] == list(NAMES)
    assert [p.shape for p in lstm.parameters()] == [(20, 3), (20, 5), (20,), (20,)]
    assert lstm.flops((7, 2, 3)) == 2 * 7 * 2 * 20 * (3 + 5)


def test_rnn_bad_input_is_refused():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="num_layers=1"):
        nn.LSTM(3, 4, num_layers=2, rng=rng)
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNN(3, 4, nonlinearity="sigmoid", rng=rng)
    layer = nn.RNN(3, 4, rng=rng, dtype=np.float64)
    with pytest.raises(ValueError, match=r"\(T, N, input_size\)"):
        layer.forward(np.zeros((5, 2, 4)))
    with pytest.raises(ValueError, match="h0 of shape"):
        layer.forward(np.zeros((5, 2, 3)), np.zeros((1, 3, 4)))
    with pytest.raises(TypeError, match=r"\(h0, c0\)"):
        nn.LSTM(3, 4, rng=rng).forward(np.zeros((5, 2, 3), np.float32), np.zeros((1, 2, 4), np.float32))
