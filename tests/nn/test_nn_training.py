"""End to end: an MLP and a small CNN learn the real digits; seeded runs are bitwise identical."""

import numpy as np
import pytest

from minidist.data import iterate_batches, load_digits
from minidist.nn import BatchNorm2d, Conv2d, CrossEntropyLoss, Flatten, Linear, MaxPool2d, ReLU, Sequential
from minidist.optim import SGD
from minidist.recipes.demo import main as demo_main
from minidist.recipes.demo import train_digits_mlp


@pytest.mark.exercise("linear")
@pytest.mark.exercise("cross_entropy_backward")
@pytest.mark.exercise("sgd_momentum")  # SGD with momentum (minidist/optim/sgd.py)
def test_mlp_reaches_95_percent_and_is_bitwise_reproducible():
    full = train_digits_mlp(seed=0)
    assert full.test_accuracies[-1] >= 0.95, full.test_accuracies
    assert full.epoch_losses[-1] < 0.1 * full.epoch_losses[0]
    first, second = train_digits_mlp(seed=0, epochs=2), train_digits_mlp(seed=0, epochs=2)
    assert first.step_losses == second.step_losses  # float equality of every loss: bitwise
    for p, q in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert np.array_equal(p.data, q.data)
    other = train_digits_mlp(seed=1, epochs=1)
    assert other.step_losses[0] != first.step_losses[0]  # the seed matters


@pytest.mark.exercise("linear")
@pytest.mark.exercise("conv2d_backward")
@pytest.mark.exercise("batchnorm_backward")
@pytest.mark.exercise("cross_entropy_backward")
@pytest.mark.exercise("sgd_momentum")  # SGD with momentum (minidist/optim/sgd.py)
def test_small_cnn_learns_the_digits():
    data = load_digits(images=True)
    rng = np.random.default_rng(0)
    model = Sequential(Conv2d(1, 8, 3, padding=1, rng=rng), BatchNorm2d(8), ReLU(), MaxPool2d(2),
                       Flatten(), Linear(8 * 4 * 4, 10, rng=rng))
    loss_fn = CrossEntropyLoss()
    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        for idx in iterate_batches(len(data.y_train), 32, rng):
            loss_fn.forward(model.forward(data.x_train[idx]), data.y_train[idx])
            optimizer.zero_grad()
            model.backward(loss_fn.backward())
            optimizer.step()
    model.eval()
    accuracy = (model.forward(data.x_test).argmax(axis=1) == data.y_test).mean()
    assert accuracy >= 0.9, accuracy


@pytest.mark.exercise("linear")
@pytest.mark.exercise("cross_entropy_backward")
@pytest.mark.exercise("sgd_momentum")  # SGD with momentum (minidist/optim/sgd.py)
def test_demo_prints_a_table_and_saves_the_figure(capsys, monkeypatch, tmp_path):
    import minidist.recipes.demo

    monkeypatch.setattr(minidist.recipes.demo, "FIGURES", tmp_path)
    assert demo_main() == 0
    out = capsys.readouterr().out
    assert "epoch  train loss  test accuracy" in out and "test accuracy 9" in out
    assert (tmp_path / "00_demo_loss.png").stat().st_size > 10_000
