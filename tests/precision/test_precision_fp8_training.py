"""The FP8 recipe's pieces: the rising floor of EnhancedLossScaler, gradient clipping after unscaling
(equal to torch's clip_grad_norm_), and the trainer's formats (W, A, E, G in E5M2, FP16 masters)."""

from __future__ import annotations

import numpy as np
import pytest

from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD
from minidist.precision import FP8_E5M2, FP16, StaticLossScaler, quantize
from minidist.precision.fp8_training import (
    EnhancedLossScaler,
    clip_grad_norm_,
    fp8_trainer,
    train_batches,
    train_step,
)


def test_the_floor_rises_on_its_schedule_and_holds_the_scale_up():
    scaler = EnhancedLossScaler([(0, 4.0), (3, 64.0), (5, 1024.0)], init_scale=16.0, growth_interval=100)
    seen = []
    for _ in range(6):
        scaler.update(True)                  # every step overflows: the scale would halve each time
        seen.append(scaler.scale)
    assert seen == [8.0, 4.0, 64.0, 64.0, 1024.0, 1024.0]
    assert [scaler.floor_at(u) for u in (0, 2, 3, 4, 5, 99)] == [4.0, 4.0, 64.0, 64.0, 1024.0, 1024.0]
    grows = EnhancedLossScaler([(2, 8.0)], init_scale=1.0, growth_interval=1)
    assert grows.floor_at(1) is None and grows.min_scale is None
    grows.update(False)
    grows.update(False)                      # grown to 4, then lifted to the floor 8
    assert grows.scale == 8.0


@pytest.mark.parametrize("floors", [[], [(1, 4.0), (1, 8.0)], [(0, 8.0), (2, 4.0)], [(0, -1.0)],
                                    [(-1, 2.0)], [(0.5, 2.0)], [4.0]])
def test_bad_floors_are_refused(floors):
    with pytest.raises((ValueError, TypeError), match="floor"):
        EnhancedLossScaler(floors)


def test_clip_grad_norm_equals_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(5).astype(np.float32)]
    tensors = [torch.nn.Parameter(torch.zeros(g.shape)) for g in grads]
    for t, g in zip(tensors, grads, strict=True):
        t.grad = torch.from_numpy(g.copy())
    theirs = float(torch.nn.utils.clip_grad_norm_(tensors, 1.5))
    ours = clip_grad_norm_(grads, 1.5)
    assert abs(ours - theirs) < 1e-5 * theirs
    for t, g in zip(tensors, grads, strict=True):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-6)
    assert abs(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads)) - 1.5) < 1e-5
    small = [np.full(4, 0.1, dtype=np.float32)]
    assert clip_grad_norm_(small, 1.0) == pytest.approx(0.2) and np.all(small[0] == np.float32(0.1))
    infinite = [np.array([np.inf, 1.0])]
    assert clip_grad_norm_(infinite, 1.0) == np.inf and infinite[0][1] == 1.0
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm_(small, 0.0)


def make_trainer(scale: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    model = Sequential(Linear(6, 8, rng=rng), ReLU(), Linear(8, 3, rng=rng))
    trainer = fp8_trainer(model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(),
                          np.random.default_rng(1), scaler=StaticLossScaler(scale))
    return model, trainer


def test_clipping_acts_on_the_unscaled_gradients_whatever_the_scale():
    """Scales 2^4 and 2^8 (powers of two: unscaling is exact) give the same clipped gradients."""
    x, y = np.random.default_rng(2).standard_normal((16, 6)).astype(np.float32), np.arange(16) % 3
    grads, norms = [], []
    for scale in (2.0**4, 2.0**8):
        model, trainer = make_trainer(scale)
        report = train_step(trainer, x, y, max_norm=0.05)
        assert report.applied and report.scale == scale and report.grad_norm > 0.05
        grads.append([p.grad.copy() for p in model.parameters()])
        norms.append(report.grad_norm)
    assert norms[0] == norms[1]
    for a, b in zip(*grads, strict=True):
        np.testing.assert_array_equal(a, b)
    assert abs(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads[0])) - 0.05) < 1e-6


def test_the_recipe_keeps_fp16_masters_and_trains():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    model, trainer = make_trainer(2.0**10, seed=4)
    assert (trainer.fmt, trainer.grad_fmt, trainer.master_fmt) == (FP8_E5M2, FP8_E5M2, FP16)
    assert trainer.update_rounding == "stochastic"
    batches = [np.arange(i, i + 16) for _ in range(40) for i in range(0, 64, 16)]
    reports = train_batches(trainer, x, y, batches, max_norm=5.0)
    assert len(reports) == 160 and all(r.applied for r in reports)
    assert np.mean([r.loss for r in reports[-8:]]) < 0.6 * np.mean([r.loss for r in reports[:8]])
    for p in model.parameters():                          # masters hold FP16 values
        np.testing.assert_array_equal(p.data, quantize(p.data, FP16))


def test_an_overflowing_step_is_skipped_and_reported():
    model, trainer = make_trainer(2.0**60)
    before = [p.data.copy() for p in model.parameters()]
    report = train_step(trainer, np.ones((4, 6), dtype=np.float32), np.arange(4) % 3, max_norm=1.0)
    assert not report.applied and not np.isfinite(report.grad_norm)
    assert all(np.array_equal(p.data, b) for p, b in zip(model.parameters(), before, strict=True))
