"""The step runner: events in order, a composite unit, the skipped input gradient, and the same
gradients as the model's own backward (checked against PyTorch autograd in float64)."""

import numpy as np
import pytest

from minidist.nn import CrossEntropyLoss, LayerNorm, Linear, ReLU, Sequential, Tanh
from minidist.nn.module import Module
from minidist.nn.runner import Attachment, StepRunner, backward_through, units


class Residual(Module):
    """y = x + f(x): a composite unit the runner treats as one layer (as a transformer block)."""

    def __init__(self, f: Module):
        self.f = f

    def forward(self, x):
        return x + self.f.forward(x)

    def backward(self, dy):
        return dy + self.f.backward(dy)


class Recorder(Attachment):
    def __init__(self):
        self.events = []

    def begin(self, runner):
        self.events.append("begin")

    def before_forward(self, i, layer, x):
        self.events.append(("before_forward", i))
        return x

    def after_forward(self, i, layer, y):
        self.events.append(("after_forward", i))
        return y

    def after_loss(self, dy):
        self.events.append("after_loss")
        return dy

    def before_backward(self, i, layer, dy):
        self.events.append(("before_backward", i))
        return dy

    def after_backward(self, i, layer, dx):
        self.events.append(("after_backward", i, all(np.any(p.grad != 0) for p in layer.parameters())))
        return dx

    def end_backward(self):
        self.events.append("end_backward")

    def end(self):
        self.events.append("end")


def make_model(rng, dtype=np.float64):
    block = Residual(Sequential(LayerNorm(6, dtype=dtype), Linear(6, 6, rng=rng, dtype=dtype), Tanh()))
    return Sequential(ReLU(), Linear(5, 6, rng=rng, dtype=dtype),
                      Sequential(block, ReLU()), Linear(6, 3, rng=rng, dtype=dtype))


def test_runner_units_fire_events_in_order_with_gradients_ready():
    rng = np.random.default_rng(0)
    model = make_model(rng)
    assert [type(u).__name__ for u in units(model)] == ["ReLU", "Linear", "Residual", "ReLU", "Linear"]
    recorder = Recorder()
    runner = StepRunner(model, CrossEntropyLoss(), [recorder])
    runner.forward_backward(rng.standard_normal((4, 5)), rng.integers(0, 3, 4))
    forward = [e for i in range(5) for e in (("before_forward", i), ("after_forward", i))]
    # unit 0 (ReLU, before the first parameters) is not run backward: the batch needs no gradient
    backward = [e for i in (4, 3, 2, 1) for e in (("before_backward", i), ("after_backward", i, True))]
    assert recorder.events == ["begin", *forward, "after_loss", *backward, "end_backward", "end"]


def test_runner_gradients_equal_the_models_backward_and_the_first_linear_skips_dx():
    rng = np.random.default_rng(1)
    model = make_model(rng)
    x, y = rng.standard_normal((4, 5)), rng.integers(0, 3, 4)
    loss_fn = CrossEntropyLoss()
    loss_fn.forward(model.forward(x), y)
    model.backward(loss_fn.backward())
    expected = [p.grad.copy() for p in model.parameters()]
    model.zero_grad()
    first = model[1]
    calls = []
    original = first.backward
    first.backward = lambda dy: calls.append(first.input_grad) or original(dy)
    loss = StepRunner(model, CrossEntropyLoss()).forward_backward(x, y)
    assert calls == [False] and first.input_grad is True        # dx skipped, the switch restored
    assert loss == loss_fn.forward(model.forward(x), y)
    for p, g in zip(model.parameters(), expected, strict=True):
        np.testing.assert_allclose(p.grad, g, rtol=1e-12, atol=1e-12)


def test_runner_matches_torch_autograd():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    model = Sequential(Linear(5, 7, rng=rng, dtype=np.float64), ReLU(),
                       Linear(7, 3, rng=rng, dtype=np.float64))
    x, y = rng.standard_normal((6, 5)), rng.integers(0, 3, 6)
    loss = StepRunner(model, CrossEntropyLoss()).forward_backward(x, y)
    tm = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3)).double()
    with torch.no_grad():
        for tp, p in zip(tm.parameters(), model.parameters(), strict=True):
            tp.copy_(torch.from_numpy(p.data))
    tl = torch.nn.functional.cross_entropy(tm(torch.from_numpy(x)), torch.from_numpy(y))
    tl.backward()
    assert abs(loss - tl.item()) < 1e-12
    for tp, p in zip(tm.parameters(), model.parameters(), strict=True):
        np.testing.assert_allclose(p.grad, tp.grad.numpy(), rtol=1e-10, atol=1e-12)


class Doubler(Attachment):
    def after_loss(self, dy):
        return 2 * dy


class Boom(Attachment):
    def after_forward(self, i, layer, y):
        raise RuntimeError("boom")


def test_attachments_replace_values_and_end_runs_when_a_layer_raises():
    rng = np.random.default_rng(3)
    model = Sequential(Linear(4, 3, rng=rng, dtype=np.float64))
    x, y = rng.standard_normal((2, 4)), rng.integers(0, 3, 2)
    StepRunner(model, CrossEntropyLoss()).forward_backward(x, y)
    once = model.parameters()[0].grad.copy()
    model.zero_grad()
    StepRunner(model, CrossEntropyLoss(), [Doubler()]).forward_backward(x, y)
    np.testing.assert_allclose(model.parameters()[0].grad, 2 * once, rtol=1e-14)
    recorder = Recorder()
    with pytest.raises(RuntimeError, match="boom"):
        StepRunner(model, CrossEntropyLoss(), [recorder, Boom()]).forward(x)
    assert recorder.events[-1] == "end"


def test_backward_through_with_input_grad_returns_dx_and_runner_refuses_bad_input():
    rng = np.random.default_rng(4)
    layers = [Linear(3, 4, rng=rng, dtype=np.float64), ReLU()]
    h = layers[1].forward(layers[0].forward(rng.standard_normal((2, 3))))
    assert backward_through(layers, np.ones_like(h)).shape == (2, 3)
    assert backward_through(layers, np.ones_like(h), input_grad=False) is None
    with pytest.raises(TypeError, match="minidist Module"):
        StepRunner(lambda x: x)
    with pytest.raises(ValueError, match="needs a loss"):
        StepRunner(Sequential(*layers)).forward_backward(np.zeros((2, 3)), np.zeros(2, dtype=int))


class TwoLayer(Module):
    """A composite that exposes its chain of sub-layers to the runner (as a GPT can)."""

    def __init__(self, rng):
        self.first, self.act, self.second = (Linear(4, 5, rng=rng, dtype=np.float64), Tanh(),
                                             Linear(5, 3, rng=rng, dtype=np.float64))

    def units(self):
        return [self.first, self.act, self.second]

    def forward(self, x):
        return self.second.forward(self.act.forward(self.first.forward(x)))

    def backward(self, dy):
        return self.first.backward(self.act.backward(self.second.backward(dy)))


def test_a_composite_exposing_units_is_stepped_through_them_with_the_same_gradients():
    rng = np.random.default_rng(5)
    model = TwoLayer(rng)
    assert units(model) == [model.first, model.act, model.second]
    x, y = rng.standard_normal((3, 4)), rng.integers(0, 3, 3)
    loss_fn = CrossEntropyLoss()
    loss_fn.forward(model.forward(x), y)
    model.backward(loss_fn.backward())
    expected = [p.grad.copy() for p in model.parameters()]
    model.zero_grad()
    recorder = Recorder()
    StepRunner(model, CrossEntropyLoss(), [recorder]).forward_backward(x, y)
    assert [e[1] for e in recorder.events if e[0] == "after_backward"] == [2, 1, 0]
    for p, g in zip(model.parameters(), expected, strict=True):
        np.testing.assert_allclose(p.grad, g, rtol=1e-12, atol=1e-12)
