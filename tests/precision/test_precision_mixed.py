"""Mixed-precision training: close to FP32, loss scaling saves small gradients, overflow skips steps."""

import numpy as np
import pytest

from minidist.data import blobs
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD
from minidist.precision import (
    BF16,
    FP8_E5M2,
    FP16,
    DynamicLossScaler,
    MixedPrecisionTrainer,
    StaticLossScaler,
    quantize,
)

DLS = pytest.mark.exercise("dynamic_loss_scaling")


def make_model(seed=0):
    rng = np.random.default_rng(seed)
    return Sequential(Linear(6, 32, rng=rng), ReLU(), Linear(32, 4, rng=rng))


def data():
    x, y = blobs(50, 4, 6, np.random.default_rng(1))
    return x.astype(np.float32), y


def train_fp32(model, x, y, steps, lr=0.1):
    opt, loss_fn = SGD(model.parameters(), lr=lr), CrossEntropyLoss()
    for _ in range(steps):
        opt.zero_grad()
        loss_fn.forward(model.forward(x), y)
        model.backward(loss_fn.backward())
        opt.step()
    return loss_fn.forward(model.forward(x), y)


@DLS
@pytest.mark.parametrize("fmt", [FP16, BF16])
def test_mixed_precision_close_to_fp32(fmt):
    x, y = data()
    reference = make_model()
    ref_loss = train_fp32(reference, x, y, 60)
    model = make_model()
    trainer = MixedPrecisionTrainer(model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), fmt)
    for _ in range(60):
        trainer.train_step(x, y)
    loss = CrossEntropyLoss().forward(model.forward(x), y)
    assert trainer.steps_skipped == 0 and trainer.steps_taken == 60
    assert abs(loss - ref_loss) < 0.02 * ref_loss + 1e-3, (loss, ref_loss)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert np.abs(p.data - q.data).max() < 0.02 * np.abs(q.data).max() + (1e-3 if fmt is FP16 else 1e-2)
        assert p.data.dtype == np.float32                   # masters stay FP32 ...
    assert not np.array_equal(model.parameters()[0].data, quantize(model.parameters()[0].data, fmt))


@DLS
def test_split_step_equals_train_step_and_gradients_are_unscaled():
    x, y = data()
    runs = []
    for split in (False, True):
        model = make_model()
        trainer = MixedPrecisionTrainer(model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), FP16)
        for _ in range(3):
            if split:
                trainer.optimizer.zero_grad()
                trainer.forward_backward(x, y)
                found_inf = trainer.unscale()
                trainer.step(found_inf)
            else:
                trainer.train_step(x, y)
        runs.append([p.data.copy() for p in model.parameters()])
    assert all(np.array_equal(a, b) for a, b in zip(*runs, strict=True))
    # after unscale the gradient is the FP32 one up to FP16 rounding
    model = make_model()
    trainer = MixedPrecisionTrainer(model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), FP16,
                                    scaler=StaticLossScaler(1024.0))
    trainer.forward_backward(x, y)
    trainer.unscale()
    reference = make_model()
    loss_fn = CrossEntropyLoss()
    loss_fn.forward(reference.forward(x), y)
    reference.backward(loss_fn.backward())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert np.abs(p.grad - q.grad).max() < 1e-2 * np.abs(q.grad).max()


@DLS
def test_overflow_skips_the_step_and_backs_off():
    x, y = data()
    model = make_model()
    before = [p.data.copy() for p in model.parameters()]
    scaler = DynamicLossScaler(init_scale=2.0**40)          # dL/dlogits · 2^40 overflows FP16
    trainer = MixedPrecisionTrainer(model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), FP16,
                                    scaler=scaler)
    loss, applied = trainer.train_step(x, y)
    assert not applied and scaler.scale == 2.0**39
    assert all(np.array_equal(a, p.data) for a, p in zip(before, model.parameters(), strict=True))
    while not trainer.train_step(x, y)[1]:
        pass
    assert trainer.steps_skipped >= 10 and scaler.scale <= 2.0**30
    assert np.isfinite(loss)


def test_loss_scaling_saves_gradients_that_underflow_in_fp16():
    """A confident model has tiny loss gradients (median ~4e-8): without scaling half of the non-zero
    FP32 weight gradients underflow to 0 in FP16 (min subnormal 6e-8); GradScaler's 2^16 keeps them."""
    x, y = data()
    model = make_model()
    train_fp32(model, x, y, 100, lr=0.5)
    model[2].weight.data *= 4                 # sharpen the softmax: p(correct) -> 1, gradients -> tiny
    model[2].bias.data *= 4
    reference = make_model()
    reference.load_state_dict(model.state_dict())
    loss_fn = CrossEntropyLoss()
    loss_fn.forward(reference.forward(x), y)
    reference.backward(loss_fn.backward())
    g32 = np.concatenate([p.grad.ravel() for p in reference.parameters()])
    lost = {}
    for scale in (1.0, 2.0**16):
        trainer = MixedPrecisionTrainer(model, SGD(model.parameters(), lr=0.0), CrossEntropyLoss(), FP16,
                                        scaler=StaticLossScaler(scale))
        trainer.optimizer.zero_grad()
        trainer.forward_backward(x, y)
        assert not trainer.unscale()
        g16 = np.concatenate([p.grad.ravel() for p in model.parameters()])
        lost[scale] = np.mean((g16 == 0) & (g32 != 0)) / np.mean(g32 != 0)
    assert lost[1.0] > 0.3 and lost[2.0**16] < 0.05, lost


@pytest.mark.exercise("stochastic_rounding")
def test_fp16_masters_with_stochastic_update_are_reproducible_and_in_format():
    x, y = data()
    results = []
    for seed in (5, 5):
        model = make_model()
        trainer = MixedPrecisionTrainer(model, SGD(model.parameters(), lr=0.05), CrossEntropyLoss(), FP8_E5M2,
                                        grad_fmt=FP8_E5M2, scaler=StaticLossScaler(2.0**8), master_fmt=FP16,
                                        update_rounding="stochastic", rng=np.random.default_rng(seed))
        for _ in range(5):
            trainer.train_step(x, y)
        results.append([p.data.copy() for p in model.parameters()])
        assert all(np.array_equal(p.data, quantize(p.data, FP16)) for p in model.parameters())
    assert all(np.array_equal(a, b) for a, b in zip(*results, strict=True))


def test_bad_arguments():
    model = make_model()
    opt = SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError):
        MixedPrecisionTrainer("model", opt, CrossEntropyLoss(), FP16)
    with pytest.raises(TypeError):
        MixedPrecisionTrainer(model, object(), CrossEntropyLoss(), FP16)
    with pytest.raises(ValueError, match="rng"):
        MixedPrecisionTrainer(model, opt, CrossEntropyLoss(), FP16, update_rounding="stochastic")
    with pytest.raises(ValueError, match="update_rounding"):
        MixedPrecisionTrainer(model, opt, CrossEntropyLoss(), FP16, update_rounding="down")
    with pytest.raises(TypeError, match="FloatFormat"):
        MixedPrecisionTrainer(model, opt, CrossEntropyLoss(), "fp16")
    with pytest.raises(TypeError, match="scaler"):
        MixedPrecisionTrainer(model, opt, CrossEntropyLoss(), FP16, scaler=1024)


def test_step_takes_a_bool_found_inf_and_changes_nothing_otherwise():
    model = make_model()
    trainer = MixedPrecisionTrainer(model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), FP16)
    before = [p.data.copy() for p in model.parameters()]
    for flag in ("no", 0, None):
        with pytest.raises(TypeError, match="found_inf must be True or False"):
            trainer.step(flag)
    assert all(np.array_equal(p.data, b) for p, b in zip(model.parameters(), before, strict=True))
    assert trainer.steps_taken == trainer.steps_skipped == 0
