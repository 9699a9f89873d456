"""Values no size check catches: NaN weights while sampling, a temperature given as text, empty sequences,
1-D router logits, NaN/inf loss coefficients. Each is a clear error at the call (never token 0 forever,
never a failure deep inside NumPy, never a NaN loss)."""

import math

import numpy as np
import pytest

from minidist import nn
from minidist.nn.moe_router import route


def _gpt():
    return nn.GPT(7, 6, 1, 8, 2, rng=np.random.default_rng(0), dtype=np.float64)


def test_generate_refuses_nan_logits_instead_of_sampling_token_zero():
    model = _gpt()
    model.head.weight.data[0, 0] = np.nan
    with pytest.raises(ValueError, match="GPT.generate logits / temperature must be finite"):
        model.generate(np.array([[1, 2]]), 3, rng=np.random.default_rng(0))
    assert model.training                      # the mode is restored on the way out


def test_generate_refuses_a_temperature_that_is_not_a_number():
    model, rng = _gpt(), np.random.default_rng(0)
    for bad, error in (("1", TypeError), (True, TypeError), (math.nan, ValueError), (math.inf, ValueError)):
        with pytest.raises(error, match="temperature"):
            model.generate(np.array([[1]]), 2, temperature=bad, rng=rng)
    assert model.generate(np.array([[1]]), 0, rng=rng).shape == (1, 1)   # zero new tokens is fine


def test_attention_refuses_an_empty_sequence():
    attention = nn.CausalSelfAttention(8, 2, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"T >= 1, got \(1, 0, 8\)"):
        attention.forward(np.zeros((1, 0, 8), np.float32))


def test_route_refuses_1d_logits_and_no_tokens():
    with pytest.raises(ValueError, match=r"expected 2 dimensions, got shape \(4,\)"):
        route(np.zeros(4), 1, 1.0)
    with pytest.raises(TypeError, match="float"):
        route(np.zeros((2, 4), np.int64), 1, 1.0)
    with pytest.raises(ValueError, match="at least one token"):
        route(np.zeros((0, 4)), 1, 1.0)            # the balance loss would be 0/0


@pytest.mark.parametrize("name", ["aux_loss_coef", "z_loss_coef"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_moe_refuses_loss_coefficients_that_are_not_finite(name, bad):
    with pytest.raises(ValueError, match=f"MoE {name} must be a finite number >= 0"):
        nn.MoE(4, 8, 2, **{name: bad}, rng=np.random.default_rng(0))


@pytest.mark.parametrize("layer", [nn.RNN, nn.LSTM])
@pytest.mark.parametrize("batch_first", [False, True])
def test_recurrent_layers_refuse_a_sequence_of_no_steps(layer, batch_first):
    """torch raises too ("Expected sequence length to be larger than 0"): there is no last state."""
    rnn = layer(3, 4, batch_first=batch_first, rng=np.random.default_rng(0))
    empty = np.zeros((2, 0, 3) if batch_first else (0, 2, 3), np.float32)
    with pytest.raises(ValueError, match="at least one step"):
        rnn.forward(empty)
