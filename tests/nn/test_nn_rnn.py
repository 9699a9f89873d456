"""nn.RNN, nn.LSTM and nn.GRU, stacked: backpropagation through time against finite differences and
PyTorch (float64) — outputs, h_n, c_n, dx, dh0, dc0 and every parameter's gradient, with gradients
arriving at both the output and the final states."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import nn
from minidist.nn.gradcheck import numerical_gradient, relative_error
from minidist.nn.gru import gru_cell_backward, gru_cell_forward
from minidist.nn.rnn import lstm_cell_backward, lstm_cell_forward


def names(num_layers: int) -> list[str]:
    kinds = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    return [f"{kind}_l{k}" for k in range(num_layers) for kind in kinds]


def _layer(kind, input_size, hidden, rng, **kw):
    return getattr(nn, kind)(input_size, hidden, rng=rng, dtype=np.float64, **kw)


def _loss_and_upstream(layer, kind, x, state, rng):
    """Forward; random upstream gradients for the output and every final state; L = Σ of their products."""
    y, final = layer.forward(x, state)
    finals = list(final) if kind == "LSTM" else [final]
    ups = [rng.standard_normal(y.shape)] + [rng.standard_normal(f.shape) for f in finals]
    return y, finals, ups


@pytest.mark.parametrize("kind,kw", [("RNN", {}), ("RNN", {"nonlinearity": "relu"}), ("LSTM", {}),
                                     ("LSTM", {"batch_first": True}), ("RNN", {"bias": False}),
                                     ("GRU", {}), ("GRU", {"num_layers": 2, "batch_first": True}),
                                     ("LSTM", {"num_layers": 3}), ("RNN", {"num_layers": 2, "bias": False})])
def test_rnn_gradients_match_finite_differences(kind, kw):
    rng = np.random.default_rng(0)
    layer = _layer(kind, 3, 4, rng, **kw)
    x = rng.standard_normal((2, 5, 3) if kw.get("batch_first") else (5, 2, 3))
    _, _, ups = _loss_and_upstream(layer, kind, x, None, rng)

    def loss():
        y, final = layer.forward(x)
        finals = list(final) if kind == "LSTM" else [final]
        return float(sum(np.sum(u * v) for u, v in zip(ups, [y, *finals], strict=True)))

    layer.zero_grad()
    layer.forward(x)
    dx = layer.backward(*ups)
    analytic = {name: p.grad.copy() for name, p in layer.named_parameters()}
    assert relative_error(dx, numerical_gradient(loss, x)) < 1e-6
    for name, p in layer.named_parameters():
        assert relative_error(analytic[name], numerical_gradient(loss, p.data)) < 1e-6, name


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


def test_gru_cell_backward_matches_finite_differences():
    rng = np.random.default_rng(2)
    a_i, a_h, h = rng.standard_normal((3, 6)), rng.standard_normal((3, 6)), rng.standard_normal((3, 2))
    g = rng.standard_normal((3, 2))

    def loss():
        return float(np.sum(g * gru_cell_forward(a_i, a_h, h)[0]))

    da_i, da_h, direct = gru_cell_backward(g, gru_cell_forward(a_i, a_h, h)[1])
    assert relative_error(da_i, numerical_gradient(loss, a_i)) < 1e-7
    assert relative_error(da_h, numerical_gradient(loss, a_h)) < 1e-7
    assert relative_error(direct, numerical_gradient(loss, h)) < 1e-7      # h enters through z ⊙ h only


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["RNN", "LSTM", "GRU"]), num_layers=st.integers(1, 3), steps=st.integers(1, 5),
       batch=st.integers(1, 3), input_size=st.integers(1, 4), hidden=st.integers(1, 5),
       batch_first=st.booleans(), with_state=st.booleans(), seed=st.integers(0, 2**16))
def test_rnn_equals_torch_autograd_float64(kind, num_layers, steps, batch, input_size, hidden, batch_first,
                                           with_state, seed):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    ours = _layer(kind, input_size, hidden, rng, num_layers=num_layers, batch_first=batch_first)
    ref = getattr(torch.nn, kind)(input_size, hidden, num_layers=num_layers, batch_first=batch_first).double()
    with torch.no_grad():
        for name in names(num_layers):
            getattr(ref, name).copy_(torch.from_numpy(getattr(ours, name).data))
    x = rng.standard_normal((batch, steps, input_size) if batch_first else (steps, batch, input_size))
    state = [rng.standard_normal((num_layers, batch, hidden)) for _ in range(2 if kind == "LSTM" else 1)]
    y, finals, ups = _loss_and_upstream(ours, kind, x, (tuple(state) if kind == "LSTM" else state[0])
                                        if with_state else None, rng)
    dx = ours.backward(*ups)

    xt = torch.from_numpy(x).requires_grad_()
    st_t = [torch.from_numpy(s).requires_grad_() for s in state]
    hx = (tuple(st_t) if kind == "LSTM" else st_t[0]) if with_state else None
    yt, final = ref(xt, hx)
    finals_t = list(final) if kind == "LSTM" else [final]
    sum((v * torch.from_numpy(u)).sum() for u, v in zip(ups, [yt, *finals_t], strict=True)).backward()
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    for mine, theirs in zip(finals, finals_t, strict=True):                     # h_n (and c_n)
        np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    for name in names(num_layers):
        np.testing.assert_allclose(getattr(ours, name).grad, getattr(ref, name).grad.numpy(), rtol=1e-10,
                                   atol=1e-12, err_msg=name)
    if with_state:
        np.testing.assert_allclose(ours.dh0, st_t[0].grad.numpy(), rtol=1e-10, atol=1e-12)
        if kind == "LSTM":
            np.testing.assert_allclose(ours.dc0, st_t[1].grad.numpy(), rtol=1e-10, atol=1e-12)


def test_rnn_parameters_have_torch_names_order_and_shapes():
    lstm = nn.LSTM(3, 5, rng=np.random.default_rng(0))
    assert [n for n, _ in lstm.named_parameters()] == names(1)
    assert [p.shape for p in lstm.parameters()] == [(20, 3), (20, 5), (20,), (20,)]
    assert lstm.flops((7, 2, 3)) == 2 * 7 * 2 * 20 * (3 + 5)
    gru = nn.GRU(3, 5, num_layers=2, rng=np.random.default_rng(0))
    assert [n for n, _ in gru.named_parameters()] == names(2)
    assert [p.shape for p in gru.parameters()] == [(15, 3), (15, 5), (15,), (15,), (15, 5), (15, 5), (15,),
                                                   (15,)]
    assert gru.flops((7, 2, 3)) == 2 * 7 * 2 * 15 * (3 + 5) + 2 * 7 * 2 * 15 * (5 + 5)


def test_rnn_outputs_are_the_last_layers_states_and_h_n_every_layers_last():
    rng = np.random.default_rng(4)
    layer = nn.GRU(3, 4, num_layers=2, rng=rng, dtype=np.float64)
    y, h_n = layer.forward(rng.standard_normal((6, 2, 3)))
    assert y.shape == (6, 2, 4) and h_n.shape == (2, 2, 4) and np.array_equal(y[-1], h_n[-1])
    x = rng.standard_normal((6, 2, 3)).astype(np.float32)
    y, (h_n, c_n) = nn.LSTM(3, 4, num_layers=3, rng=rng).forward(x)
    assert h_n.shape == c_n.shape == (3, 2, 4) and np.array_equal(y[-1], h_n[-1])


def test_rnn_bad_input_is_refused():
    rng = np.random.default_rng(0)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="num_layers must be an integer"):
            nn.LSTM(3, 4, num_layers=bad, rng=rng)
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNN(3, 4, nonlinearity="sigmoid", rng=rng)
    layer = nn.RNN(3, 4, num_layers=2, rng=rng, dtype=np.float64)
    with pytest.raises(ValueError, match=r"\(T, N, input_size\)"):
        layer.forward(np.zeros((5, 2, 4)))
    with pytest.raises(ValueError, match=r"h0 of shape \(2, 2, 4\)"):
        layer.forward(np.zeros((5, 2, 3)), np.zeros((1, 2, 4)))
    with pytest.raises(ValueError, match="at least one step"):
        layer.forward(np.zeros((0, 2, 3)))
    y, _ = layer.forward(np.zeros((5, 2, 3)))
    with pytest.raises(ValueError, match=r"dh_n of shape \(2, 2, 4\)"):
        layer.backward(np.zeros_like(y), np.zeros((1, 2, 4)))
    layer.backward(np.zeros_like(y))
    with pytest.raises(RuntimeError, match="twice"):
        layer.backward(np.zeros_like(y))
    with pytest.raises(TypeError, match=r"\(h0, c0\)"):
        nn.LSTM(3, 4, rng=rng).forward(np.zeros((5, 2, 3), np.float32), np.zeros((1, 2, 4), np.float32))
