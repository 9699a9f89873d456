"""The step runner: one training step run layer by layer, with events that strategies attach to.

Every strategy in minidist trains with this one loop (the spine of the course):

    forward    for each layer i:   x = before_forward(i, x);  y = layer(x);  y = after_forward(i, y)
    loss       loss = L(y, target);  dy = after_loss(dL/dy)
    backward   begin_backward(last)
               for each layer i, last to first:
                   dy = before_backward(i, dy);  dx = layer.backward(dy);  dx = after_backward(i, dx)
               end_backward()

``after_backward(i, ...)`` is the moment layer i's parameters' gradients are ready — where PyTorch's DDP
and FSDP hang their autograd hooks (DDP fills a bucket and starts its allreduce, ZeRO-2 starts a
reduce-scatter); ``before_forward`` and ``before_backward`` are where FSDP gathers a layer's parameters,
``after_forward`` where it frees them (as torch.nn.Module.register_forward_pre_hook / forward_hook).
``begin()`` and ``end()`` bracket a whole pass (``end`` runs even when a layer raises).

The events name what they are about: ``after_backward(i, layer, dx)`` means "``layer.parameters()`` have
their gradients", so an attachment keyed by parameter (the gradient sync) works the same on a whole model
and on a pipeline stage, whose unit i is another model's unit. ``begin_backward(last)`` says whether this
backward pass is the step's last for these parameters: a pipeline stage runs one pass per micro-batch and
passes ``last=True`` only to its last (as DDP's ``no_sync`` for the others), so gradients are synchronised
once per step. An *empty* pass, ``backward_through([], None, attachments)``, fires only begin_backward and
end_backward: the sync of gradients that were completed elsewhere (a zero-bubble table's W tasks).

An *attachment* is any object with some of these methods (subclass ``Attachment``, whose methods do
nothing); events that take a value return it, possibly replaced (mixed precision quantizes it). Like
wrappers around the layer, ``begin`` and ``before_*`` events fire in the order the attachments were given,
``after_*`` and ``end*`` events in reverse: with [strategy, clock, precision], FSDP gathers a layer before
the clock charges it, and mixed precision rounds a gradient before the strategy sends it.

The layers are the model's *units*: a Sequential's layers, nested Sequentials flattened; a module that
defines ``units()`` (sub-modules whose chain is its forward, e.g. a GPT's embedding, blocks, head) is
stepped through those; any other module (a transformer block with its residual) is one unit whose
parameters become ready together. The batch never needs a gradient, so the first unit with parameters skips dx
(the layers before it are not run backward at all), as autograd skips the gradient of an input without
requires_grad: in an MLP that is one of the step's six large matrix products.

    class Ready(Attachment):                            # say when each layer's gradients are ready
        def after_backward(self, i, layer, dx):
            print(f"layer {i} ({type(layer).__name__}): gradients ready")
            return dx

    runner = StepRunner(model, CrossEntropyLoss(), [Ready()])
    loss = runner.forward_backward(x, y)                # every .grad += its gradient; then
    optimizer.step()
"""

from __future__ import annotations

import numpy as np

from .module import Module, Sequential


class Attachment:
    """Base class of the runner's attachments: every event does nothing (override the ones you need)."""

    def begin(self, runner: StepRunner) -> None:
        """Before a forward pass or a forward-backward pass."""

    def before_forward(self, i: int, layer: Module, x: np.ndarray) -> np.ndarray:
        return x

    def after_forward(self, i: int, layer: Module, y: np.ndarray) -> np.ndarray:
        return y

    def after_loss(self, dy: np.ndarray) -> np.ndarray:
        """dy = dL/d(model output), before backward starts (loss scaling multiplies it here)."""
        return dy

    def begin_backward(self, last: bool) -> None:
        """A backward pass starts; last=False: more passes of this step follow for these parameters
        (earlier micro-batches of a pipeline stage, no_sync), so gradient sync waits."""

    def before_backward(self, i: int, layer: Module, dy: np.ndarray) -> np.ndarray:
        return dy

    def after_backward(self, i: int, layer: Module, dx: np.ndarray | None) -> np.ndarray | None:
        """Layer i's parameters' gradients are ready; dx is None when no layer below needs it."""
        return dx

    def end_backward(self) -> None:
        """Every gradient is ready (the last buckets go out, the clock waits for the streams)."""

    def end(self) -> None:
        """After the pass, also when a layer raised (mixed precision puts its master weights back)."""


def units(model: Module) -> list[Module]:
    """The layers the runner steps through: a Sequential's layers, or what a module's own ``units()``
    returns (flattened the same way), or the model itself as one unit."""
    if isinstance(model, Sequential):
        return [unit for layer in model for unit in units(layer)]
    if callable(getattr(model, "units", None)):
        return [unit for layer in model.units() for unit in units(layer)]
    return [model]


def backward_through(layers: list[Module], dy: np.ndarray, attachments: list = (), input_grad: bool = True,
                     *, last: bool = True):
    """The library's one layer-by-layer backward loop: dy (shape of the last layer's output) -> dx.

    Each layer adds its parameters' gradients; with input_grad=False the layers below the first one
    with parameters are skipped, that one computes no dx (if it can), and None is returned. ``last``:
    this pass is the step's last for these parameters (attachments get it in begin_backward).
    """
    first = 0 if input_grad else next((i for i, m in enumerate(layers) if m.parameters()), len(layers))
    for a in attachments:
        a.begin_backward(last)
    inner_first = attachments[::-1]
    for i in reversed(range(first, len(layers))):
        layer = layers[i]
        for a in attachments:
            dy = a.before_backward(i, layer, dy)
        dy = layer.backward(dy) if input_grad or i > first else backward_without_dx(layer, dy)
        for a in inner_first:
            dy = a.after_backward(i, layer, dy)
    for a in inner_first:
        a.end_backward()
    return dy if input_grad else None


def backward_without_dx(layer: Module, dy: np.ndarray) -> None:
    """Backward of a layer whose input needs no gradient: only its parameters' gradients.

    Layers with an ``input_grad`` switch (Linear, the tensor-parallel linears) skip the dx product;
    any other layer computes dx and it is dropped.
    """
    if not hasattr(layer, "input_grad"):
        layer.backward(dy)
        return
    wanted, layer.input_grad = layer.input_grad, False
    try:
        layer.backward(dy)
    finally:
        layer.input_grad = wanted


class StepRunner:
    """Runs ``model`` layer by layer with ``loss_fn`` and fires the events of ``attachments``.

    Args:
        model: a minidist Module (a Sequential is stepped through layer by layer, see ``units``).
        loss_fn: e.g. CrossEntropyLoss(); only forward_backward needs it.
        attachments: objects with some of Attachment's methods; begin and before_* events fire in this
            order, after_* and end* events in reverse (see the module docstring).
        input_grad: compute the gradient of the model's input (a pipeline stage that is not the first
            needs it; the batch does not).
    """

    def __init__(self, model: Module, loss_fn=None, attachments=(), *, input_grad: bool = False):
        if not isinstance(model, Module):
            raise TypeError(f"model must be a minidist Module, got {type(model).__name__}")
        self.model, self.loss_fn, self.input_grad = model, loss_fn, bool(input_grad)
        self.layers = units(model)
        self.attachments = list(attachments)
        self.dx: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: the batch, shape (B, ...); returns the model's output (B, ...). Fires begin ... end."""
        self._begin()
        try:
            return self._forward(x)
        finally:
            self._end()

    def forward_backward(self, x: np.ndarray, target: np.ndarray, *, last: bool = True) -> float:
        """Forward, loss, backward; adds every parameter's gradient into its .grad; returns the loss.

        x: the batch (B, ...); target: what loss_fn compares the output with (B, ...). With input_grad,
        the gradient of x (B, ...) is left in ``self.dx`` (a pipeline's last stage sends it back).
        last=False: more passes of this step follow (gradient accumulation; see begin_backward).
        """
        if self.loss_fn is None:
            raise ValueError("forward_backward needs a loss: StepRunner(model, loss_fn)")
        self._begin()
        try:
            loss = self.loss_fn.forward(self._forward(x), target)
            dy = self.loss_fn.backward()
            for a in reversed(self.attachments):
                dy = a.after_loss(dy)
            self.dx = backward_through(self.layers, dy, self.attachments, self.input_grad, last=last)
        finally:
            self._end()
        return loss

    def backward(self, dy: np.ndarray, *, last: bool = True) -> np.ndarray | None:
        """dy: gradient of the output, shape of forward's output (a pipeline stage's, from the next
        stage); returns dx (None unless input_grad). Fires the backward events, not begin/end; last=False
        for every micro-batch of a stage but its last."""
        return backward_through(self.layers, dy, self.attachments, self.input_grad, last=last)

    def _forward(self, x: np.ndarray) -> np.ndarray:
        for i, layer in enumerate(self.layers):
            for a in self.attachments:
                x = a.before_forward(i, layer, x)
            x = layer.forward(x)
            for a in reversed(self.attachments):
                x = a.after_forward(i, layer, x)
        return x

    def _begin(self) -> None:
        for a in self.attachments:
            a.begin(self)

    def _end(self) -> None:
        for a in reversed(self.attachments):
            a.end()
