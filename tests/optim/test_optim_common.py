"""What every optimizer shares: state_dict round trips, chunked updates, weight decay, bad
hyper-parameters."""

import copy

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minidist.optim.optimizer as optimizer_module
from minidist.nn import Parameter
from minidist.optim import LAMB, LARS, SGD, Adagrad, Adam, AdamW, RMSprop

from .optim_helpers import initial_values, lr_with_change, make_params, run_minidist

sgd_momentum = pytest.mark.exercise("sgd_momentum")
adam = pytest.mark.exercise("adam")

EVERY_OPTIMIZER = [
    pytest.param(SGD, {"lr": 0.05}, id="sgd"),
    pytest.param(
        SGD,
        {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
        id="sgd_momentum",
        marks=sgd_momentum,
    ),
    pytest.param(SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True}, id="sgd_nesterov", marks=sgd_momentum),
    pytest.param(Adam, {"lr": 0.01, "amsgrad": True, "weight_decay": 0.01}, id="adam_amsgrad", marks=adam),
    pytest.param(AdamW, {"lr": 0.01}, id="adamw", marks=adam),
    pytest.param(RMSprop, {"lr": 0.01, "momentum": 0.5, "centered": True}, id="rmsprop"),
    pytest.param(Adagrad, {"lr": 0.05, "lr_decay": 0.01, "initial_accumulator_value": 0.1}, id="adagrad"),
    pytest.param(LARS, {"lr": 1.0, "weight_decay": 0.01}, id="lars"),
    pytest.param(LAMB, {"lr": 0.01, "weight_decay": 0.01}, id="lamb",
                 marks=pytest.mark.exercise("lamb_trust_ratio")),
]


@pytest.mark.parametrize("cls, kwargs", EVERY_OPTIMIZER)
def test_state_dict_round_trip_continues_bitwise(cls, kwargs):
    """Save after 10 steps, keep going 10 more; a fresh optimizer loaded from the save does the same."""
    lr_of = lr_with_change(kwargs["lr"], at=12)  # the lr changes after the save: it must be restored too
    original = cls(make_params(initial_values(seed=4)), **kwargs)
    run_minidist(original, range(10), lr_of)
    saved_weights = [p.data.copy() for p in original.params]
    saved = copy.deepcopy(original.state_dict())
    expected = run_minidist(original, range(10, 20), lr_of)

    resumed = cls(make_params(saved_weights), **kwargs)
    resumed.load_state_dict(saved)
    for arrays in saved["state"]:  # load copies: scribbling on the dict afterwards changes nothing
        for a in arrays.values():
            a[...] = np.nan
    got = run_minidist(resumed, range(10, 20), lr_of)
    for mine, ref in zip(got, expected, strict=True):
        for a, b in zip(mine, ref, strict=True):
            np.testing.assert_array_equal(a, b)
    assert resumed.step_count == original.step_count == 20


@pytest.mark.parametrize("cls, kwargs", EVERY_OPTIMIZER)
def test_chunked_update_is_bitwise_the_whole_array_update(cls, kwargs, monkeypatch):
    values = initial_values(seed=5, dtype=np.float32)  # the (3, 4) parameter spans several 5-element chunks
    whole = run_minidist(cls(make_params(values), **kwargs), range(4))
    monkeypatch.setattr(optimizer_module, "CHUNK_ELEMENTS", 5)
    chunked = run_minidist(cls(make_params(values), **kwargs), range(4))
    for mine, ref in zip(chunked, whole, strict=True):
        for a, b in zip(mine, ref, strict=True):
            assert a.dtype == np.float32
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cls, kwargs", EVERY_OPTIMIZER)
def test_step_does_not_touch_the_gradients(cls, kwargs):
    params = make_params(initial_values(seed=6))
    grads = [np.full(p.shape, 0.25) for p in params]
    for p, g in zip(params, grads, strict=True):
        p.grad[...] = g
    cls(params, **kwargs).step()
    for p, g in zip(params, grads, strict=True):
        np.testing.assert_array_equal(p.grad, g)


COUPLED_DECAY = [
    pytest.param(SGD, {"momentum": 0.9}, id="sgd_momentum", marks=sgd_momentum),
    pytest.param(Adam, {"amsgrad": True}, id="adam", marks=adam),
    pytest.param(RMSprop, {"centered": True}, id="rmsprop"),
    pytest.param(Adagrad, {}, id="adagrad"),
]


@pytest.mark.parametrize("cls, options", COUPLED_DECAY)
@given(weight_decay=st.floats(1e-4, 1.0), seed=st.integers(0, 2**16))
def test_weight_decay_is_exactly_the_decay_term_in_the_gradient(cls, options, weight_decay, seed):
    """weight_decay=λ fed g moves the weights exactly (bitwise) as weight_decay=0 fed g + λw, step after
    step."""
    rng = np.random.default_rng(seed)
    values = initial_values(seed)
    decayed = cls(make_params(values), lr=0.01, weight_decay=weight_decay, **options)
    plain = cls(make_params(values), lr=0.01, **options)
    for _ in range(3):
        grads = [rng.normal(size=v.shape) for v in values]
        for p, q, g in zip(decayed.params, plain.params, grads, strict=True):
            p.grad[...] = g
            q.grad[...] = g + weight_decay * q.data
        decayed.step()
        plain.step()
        for p, q in zip(decayed.params, plain.params, strict=True):
            np.testing.assert_array_equal(p.data, q.data)


@adam
@given(weight_decay=st.floats(1e-4, 1.0), lr=st.floats(1e-4, 0.1), seed=st.integers(0, 2**16))
def test_adamw_decay_is_exactly_a_shrink_before_adam(weight_decay, lr, seed):
    """AdamW(λ) = multiply w by (1 − γλ), then Adam(λ = 0): bitwise, step after step."""
    rng = np.random.default_rng(seed)
    values = initial_values(seed)
    adamw = AdamW(make_params(values), lr=lr, weight_decay=weight_decay)
    adam_ = Adam(make_params(values), lr=lr)
    for _ in range(3):
        for p, q in zip(adamw.params, adam_.params, strict=True):
            p.grad[...] = q.grad[...] = rng.normal(size=p.shape)
            q.data *= 1 - lr * weight_decay
        adamw.step()
        adam_.step()
        for p, q in zip(adamw.params, adam_.params, strict=True):
            np.testing.assert_array_equal(p.data, q.data)


BAD = [
    (Adam, {"lr": -1e-3}, r"lr must be a finite number in \[0, inf\)"),
    (Adam, {"betas": (1.0, 0.999)}, r"betas\[0\] must be a finite number in \[0, 1\)"),
    (Adam, {"betas": (0.9, -0.1)}, r"betas\[1\] .* \[0, 1\)"),
    (Adam, {"betas": (0.9,)}, r"betas must be a pair"),
    (Adam, {"eps": 0.0}, r"eps must be a finite number in \(0, inf\)"),
    (Adam, {"weight_decay": -0.1}, r"weight_decay .* \[0, inf\)"),
    (AdamW, {"eps": -1e-8}, r"eps .* \(0, inf\)"),
    (AdamW, {"betas": (0.9, 1.5)}, r"betas\[1\] .* \[0, 1\)"),
    (RMSprop, {"alpha": 1.0}, r"alpha .* \[0, 1\)"),
    (RMSprop, {"momentum": 1.2}, r"momentum .* \[0, 1\)"),
    (RMSprop, {"eps": 0}, r"eps .* \(0, inf\)"),
    (RMSprop, {"lr": float("inf")}, r"lr must be a finite number"),
    (Adagrad, {"lr_decay": -1.0}, r"lr_decay .* \[0, inf\)"),
    (Adagrad, {"initial_accumulator_value": -1.0}, r"initial_accumulator_value .* \[0, inf\)"),
    (Adagrad, {"eps": 0.0}, r"eps .* \(0, inf\)"),
    (LARS, {"lr": 1.0, "trust_coefficient": 0.0}, r"trust_coefficient .* \(0, inf\)"),
    (LARS, {"lr": 1.0, "momentum": 1.0}, r"momentum .* \[0, 1\)"),
    (LARS, {"lr": -1.0}, r"lr must be"),
]


@pytest.mark.parametrize(
    "cls, kwargs, allowed", BAD, ids=[f"{c.__name__}-{next(iter(k))}" for c, k, _ in BAD]
)
def test_bad_hyper_parameters_say_what_is_allowed(cls, kwargs, allowed):
    with pytest.raises(ValueError, match=allowed):
        cls([Parameter(np.zeros(2))], **kwargs)


def test_bad_types_are_type_errors():
    with pytest.raises(TypeError, match="real number"):
        Adam([Parameter(np.zeros(2))], lr="0.1")
    with pytest.raises(TypeError, match="amsgrad must be True or False"):
        Adam([Parameter(np.zeros(2))], amsgrad="yes")


def test_load_state_dict_rejects_what_does_not_fit():
    p = Parameter(np.zeros(3))
    adam_ = Adam([p], lr=0.1)
    with pytest.raises(ValueError, match="state_dict is for 'SGD', this is a Adam"):
        adam_.load_state_dict(SGD([Parameter(np.zeros(3))], lr=0.1).state_dict())
    with pytest.raises(ValueError, match="state for 2 parameters"):
        adam_.load_state_dict(Adam([Parameter(np.zeros(3)), Parameter(np.zeros(1))]).state_dict())
    with pytest.raises(ValueError, match=r"expected shape \(3,\), got \(4,\)"):
        adam_.load_state_dict(Adam([Parameter(np.zeros(4))]).state_dict())
    bad = Adam([Parameter(np.zeros(3))]).state_dict()
    bad["hyper_parameters"]["eps"] = -1.0
    with pytest.raises(ValueError, match="eps"):
        adam_.load_state_dict(bad)
    assert adam_.eps == 1e-8 and adam_.lr == 0.1  # a rejected load leaves the optimizer as it was


def test_gradient_of_the_wrong_shape_is_refused():
    p = Parameter(np.zeros(3))
    p.grad = np.zeros(4)
    with pytest.raises(ValueError, match=r"data's shape \(3,\)"):
        SGD([p], lr=0.1).step()


def test_an_eps_that_vanishes_in_float16_is_refused():
    with pytest.raises(ValueError, match=r"eps=1e-08 rounds to 0 in params\[0\]'s dtype float16"):
        Adam([Parameter(np.zeros(3, dtype=np.float16))])
    Adam([Parameter(np.zeros(3, dtype=np.float16))], eps=1e-4)  # representable: fine


@pytest.mark.parametrize("cls, kwargs", EVERY_OPTIMIZER)
def test_non_contiguous_parameters_update_like_contiguous_ones(cls, kwargs):
    values = initial_values(seed=7)
    column_major = [Parameter(np.array(v, order="F")) for v in values]  # (3, 4): no flat view, updated whole
    assert not column_major[0].data.flags.c_contiguous and not column_major[0].grad.flags.c_contiguous
    fortran = run_minidist(cls(column_major, **kwargs), range(3))
    contiguous = run_minidist(cls(make_params(values), **kwargs), range(3))
    for mine, ref in zip(fortran, contiguous, strict=True):
        for a, b in zip(mine, ref, strict=True):
            np.testing.assert_array_equal(a, b)
