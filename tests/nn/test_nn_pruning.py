"""Pruning: masked layers' gradient checks, masks that hold under every optimizer, channel removal that
leaves the outputs unchanged, group lasso's exact zeros, the cubic schedule, errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import (
    Conv2d,
    CrossEntropyLoss,
    Flatten,
    Linear,
    Masked,
    MaxPool2d,
    ReLU,
    Sequential,
    Sigmoid,
    channel_mask,
    cubic_sparsity,
    prune,
    unwrap,
)
from minidist.nn.gradcheck import gradcheck
from minidist.nn.prune_train import (
    group_lasso_prox,
    group_norms,
    removable_channels,
    shrink_channels,
    training_flops,
)
from minidist.optim import LARS, SGD, Adagrad, Adam, AdamW, MaskedOptimizer, RMSprop

seeds = st.integers(0, 2**32 - 1)


def small_cnn(rng, dtype=np.float64, c1=4, c2=6):
    return Sequential(
        Conv2d(1, c1, 3, padding=1, rng=rng, dtype=dtype),
        ReLU(),
        MaxPool2d(2),
        Conv2d(c1, c2, 3, padding=1, rng=rng, dtype=dtype),
        ReLU(),
        MaxPool2d(2),
        Flatten(),
        Linear(c2 * 4, 8, rng=rng, dtype=dtype),
        ReLU(),
        Linear(8, 3, rng=rng, dtype=dtype),
    )


@given(
    structure=st.sampled_from(["weights", "channels"]), sparsity=st.sampled_from([0.0, 0.3, 0.6]), seed=seeds
)
def test_masked_conv_gradcheck_and_zero_gradient(structure, sparsity, seed):
    rng = np.random.default_rng(seed)
    layer = Masked(Conv2d(3, 4, 3, padding=1, rng=rng, dtype=np.float64), structure)
    layer.prune_to(sparsity)
    errors = gradcheck(layer, rng.standard_normal((2, 3, 5, 5)), rng)
    assert max(errors.values()) < 1e-6, errors
    assert np.all(layer.layer.weight.grad[~layer.weight_mask] == 0)
    assert np.all(layer.layer.weight.data[~layer.weight_mask] == 0)


@given(sparsity=st.sampled_from([0.25, 0.5, 0.75]), seed=seeds)
def test_masked_linear_gradcheck(sparsity, seed):
    rng = np.random.default_rng(seed)
    layer = Masked(Linear(5, 4, rng=rng, dtype=np.float64))
    layer.prune_to(sparsity)
    assert layer.sparsity() == round(sparsity * 20) / 20
    errors = gradcheck(layer, rng.standard_normal((3, 5)), rng)
    assert max(errors.values()) < 1e-6, errors


OPTIMIZERS = {
    "sgd_momentum_wd": lambda ps: SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-2),
    "sgd_nesterov": lambda ps: SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
    "sgd_dampening": lambda ps: SGD(ps, lr=0.05, momentum=0.5, dampening=0.3, weight_decay=1e-3),
    "adam_wd": lambda ps: Adam(ps, lr=1e-2, weight_decay=1e-2),
    "adam_amsgrad": lambda ps: Adam(ps, lr=1e-2, amsgrad=True),
    "adamw": lambda ps: AdamW(ps, lr=1e-2, weight_decay=0.1),
    "rmsprop": lambda ps: RMSprop(ps, lr=1e-2, momentum=0.9, centered=True, weight_decay=1e-3),
    "adagrad": lambda ps: Adagrad(ps, lr=1e-2, weight_decay=1e-3),
    "lars": lambda ps: LARS(ps, lr=1.0, momentum=0.9, weight_decay=1e-3),
}


@pytest.mark.parametrize("structure", ["weights", "channels"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_pruned_weights_stay_exactly_zero_under_every_optimizer(name, structure):
    """Train dense first (so momentum/moment state exists), prune, train on: pruned weights stay +0.0."""
    rng = np.random.default_rng(1)
    model = small_cnn(rng, dtype=np.float32)
    x, y = rng.standard_normal((6, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, 6)
    loss = CrossEntropyLoss()
    optimizer = OPTIMIZERS[name](model.parameters())

    def train_step(opt):
        opt.zero_grad()
        loss.forward(model(x), y)
        model.backward(loss.backward())
        opt.step()

    for _ in range(3):
        train_step(optimizer)
    wrappers = prune(model, 0.5, structure)
    masked = MaskedOptimizer(optimizer, model)
    for _ in range(4):
        train_step(masked)
        for wrapper in wrappers:
            for p, mask in wrapper.masks():
                assert np.all(p.data[~mask] == 0) and not np.signbit(p.data[~mask]).any(), name
                assert np.all(p.data[mask] != 0)
                for array in masked.optimizer.state[masked._index[id(p)]].values():
                    assert np.all(array[..., ~mask] == 0) if array.shape[-mask.ndim:] == mask.shape else True


def test_gradual_pruning_masks_only_grow():
    rng = np.random.default_rng(2)
    model = small_cnn(rng, dtype=np.float32)
    wrappers = prune(model, 0.0)
    before = [w.weight_mask.copy() for w in wrappers]
    for step in range(0, 11):
        target = cubic_sparsity(step, 0.8, 0, 10)
        for w in wrappers:
            w.prune_to(target)
    for w, old in zip(wrappers, before, strict=True):
        assert np.all(w.weight_mask <= old)
        assert abs(w.sparsity() - 0.8) < 0.5 / w.weight_mask.size + 1e-12


def test_cubic_schedule_values():
    assert cubic_sparsity(0, 0.9, 10, 20) == 0.0
    assert cubic_sparsity(10, 0.9, 10, 20, initial_sparsity=0.1) == 0.1
    assert cubic_sparsity(15, 0.8, 10, 20) == pytest.approx(0.8 - 0.8 * 0.5**3)
    assert cubic_sparsity(99, 0.9, 10, 20) == 0.9
    with pytest.raises(ValueError, match="begin_step < end_step"):
        cubic_sparsity(0, 0.5, 5, 5)


@given(fraction=st.sampled_from([0.25, 0.5]), seed=seeds)
def test_shrunk_model_equals_masked_model(fraction, seed):
    """Channel-pruned (masked) vs physically shrunk: the same non-zero terms, summed in a possibly
    different order (BLAS blocks a shorter K differently), so equal up to float64 reassociation:
    |Δ| <= K·eps·Σ|terms| per layer; rtol 1e-10 on O(1) outputs leaves a wide margin above that."""
    rng = np.random.default_rng(seed)
    model = small_cnn(rng)
    x = rng.standard_normal((5, 1, 8, 8))
    prune(model, fraction, "channels")
    masked_out = model(x)
    unwrap(model)
    assert np.array_equal(model(x), masked_out)  # unwrapping changes nothing: the weights are zero already
    flops_before = training_flops(model, x.shape)
    left = shrink_channels(model)
    assert left == [4 - round(fraction * 4), 6 - round(fraction * 6), 8 - round(fraction * 8)]
    assert model[0].weight.shape[0] == model[3].weight.shape[1] == left[0]
    assert model[7].weight.shape == (8 - round(fraction * 8), left[1] * 4)
    np.testing.assert_allclose(model(x), masked_out, rtol=1e-10, atol=1e-12)
    assert training_flops(model, x.shape) < flops_before


def test_shrink_keeps_optimizer_running_and_cuts_its_state():
    rng = np.random.default_rng(3)
    model = small_cnn(rng)
    optimizer = Adam(model.parameters(), lr=1e-3)
    x, y = rng.standard_normal((4, 1, 8, 8)), rng.integers(0, 3, 4)
    loss = CrossEntropyLoss()
    for _ in range(2):
        optimizer.zero_grad()
        loss.forward(model(x), y)
        model.backward(loss.backward())
        optimizer.step()
    # channel 1 of conv 1 produces zeros
    model[0].weight.data[1] = 0
    model[0].bias.data[1] = 0
    model[7].weight.data[:, 8:12] = 0                       # channel 2 of conv 2 is read by nobody
    kept_m = optimizer.state[0]["exp_avg"][[0, 2, 3]].copy()
    assert [d.tolist() for d in removable_channels(model)][:2] == [[False, True, False, False],
                                                                   [False, False, True, False, False, False]]
    assert shrink_channels(model, optimizer) == [3, 5, 8]
    assert np.array_equal(optimizer.state[0]["exp_avg"], kept_m)
    for p, s in zip(optimizer.params, optimizer.state, strict=True):
        assert all(a.shape == p.shape for a in s.values()) and p.grad.shape == p.shape
    optimizer.zero_grad()
    loss.forward(model(x), y)
    model.backward(loss.backward())
    optimizer.step()


def test_group_lasso_prox_gives_exact_zeros_subgradient_does_not():
    rng = np.random.default_rng(4)
    layer = Linear(6, 5, rng=rng, dtype=np.float64)
    norms = group_norms(layer)
    strength, lr = float(np.sort(norms)[2]) + 1e-9, 1.0  # the 3 smallest groups fall below γλ
    sub = Linear(6, 5, rng=np.random.default_rng(4), dtype=np.float64)
    assert group_lasso_prox([layer], strength, lr) == 3
    assert np.sum(group_norms(layer) == 0) == 3
    survivors = norms > strength
    np.testing.assert_allclose(group_norms(layer)[survivors], norms[survivors] - strength)
    for _ in range(50):  # subgradient steps with a small rate: groups shrink but do not hit 0
        for g in range(5):
            w = np.concatenate([sub.weight.data[g], sub.bias.data[g:g + 1]])
            step = 0.01 * strength * w / np.linalg.norm(w)
            sub.weight.data[g] -= step[:-1]
            sub.bias.data[g] -= step[-1]
    assert np.all(group_norms(sub) > 0)


def test_errors():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 3))
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match=r"\[0, 1\)"):
            channel_mask(w, bad)
    with pytest.raises(TypeError):
        channel_mask(w, "half")
    with pytest.raises(ValueError, match="leaves none"):
        channel_mask(w, 0.9)
    layer = Masked(Linear(3, 4, rng=rng))
    with pytest.raises(ValueError, match="shape"):
        layer.set_masks(np.ones((3, 4), dtype=bool))
    with pytest.raises(ValueError, match="bool"):
        layer.set_masks(np.ones((4, 3)))
    with pytest.raises(ValueError, match="bias"):
        layer.set_masks(np.ones((4, 3), dtype=bool), np.ones(3, dtype=bool))
    with pytest.raises(TypeError, match="Linear or Conv2d"):
        Masked(ReLU())
    model = small_cnn(rng)
    model[3].weight.data[...] = 0
    model[3].bias.data[...] = 0
    shapes = [p.shape for p in model.parameters()]
    with pytest.raises(ValueError, match="cut the network in two"):
        shrink_channels(model)
    assert [p.shape for p in model.parameters()] == shapes  # nothing changed
    with pytest.raises(TypeError, match="Sigmoid"):
        shrink_channels(Sequential(Linear(3, 4, rng=rng), Sigmoid(), Linear(4, 2, rng=rng)))
    with pytest.raises(ValueError, match="no Masked layers"):
        MaskedOptimizer(SGD(model.parameters(), lr=0.1), model)
