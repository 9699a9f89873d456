"""Gradient checkpointing: keep a segment's input, recompute its activations during backward.

A plain segment keeps, from forward until backward, everything its backward needs (each Linear's input,
each ReLU's mask, ...): the *activations*, most of training's memory ("Activations Take Most of The
Memory", the "Hardware Accelerators for Training Deep Neural Networks" slides; the "Scaling Up Training"
slides show the trade). ``Checkpoint(segment)`` trades compute for that memory:

    forward(x):   y = segment.forward(x); then drop everything the segment saved; keep only x
    backward(dy): segment.forward(x) again (the *recompute*), then dx = segment.backward(dy)

Memory held between forward and backward:  Σ_l a_l  ->  |x|     (a_l: what layer l saves)
Memory during the segment's own backward:  |x| + Σ_l a_l again (the recompute).
Compute:  forward F, backward ≈ 2F  ->  one more F, i.e. 3F -> 4F for the checkpointed segment.

The gradients are *bitwise* those of the plain segment: before the recompute every
``numpy.random.Generator`` on the segment is rewound to its state at forward (Dropout draws the same
mask) and put back afterwards; every registered buffer (BatchNorm's running statistics) is copied before
the recompute and restored after it, so it is updated once, by forward.

How "drop everything the segment saved" works without knowing the layers: ``forward_saving(module, x)``
runs a forward pass and returns the attributes it assigned (new or rebound, by identity; parameters and
buffers excluded) as a ``SavedActivations``, which can report their size (a view counts as its base),
``release()`` them (set to None) and ``restore()`` them. The pipeline uses it to keep one micro-batch's
activations per (stage, micro-batch) while several are in flight.
"""

from __future__ import annotations

import numpy as np

from .module import Module, Parameter, Sequential
from .nbytes import distinct_nbytes, module_arrays, nbytes_of


class SavedActivations:
    """What one forward pass left on a module's layers for backward: (layer, attribute name, value)."""

    def __init__(self, entries: list[tuple[Module, str, object]]):
        self.entries = entries

    @property
    def nbytes(self) -> int:
        return nbytes_of([value for _, _, value in self.entries])

    def restore(self) -> None:
        """Put the values back on their layers (before this forward's backward)."""
        for layer, name, value in self.entries:
            setattr(layer, name, value)

    def release(self) -> None:
        """Let go of the values on the layers (this object still holds them unless dropped too)."""
        for layer, name, _ in self.entries:
            setattr(layer, name, None)


def _kept_names(layer: Module) -> set[str]:
    """Attributes that are state, not activations: parameters, buffers, sub-modules, the mode flag."""
    names = set(vars(layer).get("_buffer_names", [])) | {"_buffer_names", "training"}
    for name, value in vars(layer).items():
        if isinstance(value, (Parameter, Module, np.random.Generator)):
            names.add(name)
        elif isinstance(value, list) and value and all(isinstance(v, Module) for v in value):
            names.add(name)  # Sequential.layers
    return names


def assigned_since(before: list[tuple[Module, dict]]) -> SavedActivations:
    """The attributes assigned (new or rebound) on each layer since the snapshot ``before``."""
    entries = []
    for layer, old in before:
        kept = _kept_names(layer)
        for name, value in vars(layer).items():
            if name not in kept and (name not in old or old[name] is not value):
                entries.append((layer, name, value))
    return SavedActivations(entries)


def forward_saving(module: Module, x: np.ndarray, forward=None) -> tuple[np.ndarray, SavedActivations]:
    """y = module.forward(x), and the attributes that forward assigned on module and its sub-modules.

    ``forward`` (a function x -> y) replaces ``module.forward`` when the caller runs the layers itself,
    e.g. the pipeline, which charges each layer's FLOPs to the simulated clock as it goes.
    """
    before = [(layer, dict(vars(layer))) for layer in module.modules()]
    y = (forward or module.forward)(x)
    return y, assigned_since(before)


def forward_flops(layer: Module, input_shape: tuple[int, ...]) -> int:
    """The layer's forward FLOPs for an input of input_shape (a multiply-add counts 2).

    Layers that compute expose ``flops(input_shape)``; a layer without it and without parameters
    (e.g. Flatten) is counted as free; a layer with parameters but no ``flops`` is an error.
    """
    if hasattr(layer, "flops"):
        return int(layer.flops(tuple(input_shape)))
    if layer.parameters():
        raise TypeError(f"{type(layer).__name__} has parameters but no flops(input_shape): cannot price it")
    return 0


def _generators(module: Module) -> list[tuple[Module, str, np.random.Generator]]:
    return [(layer, name, value) for layer in module.modules() for name, value in vars(layer).items()
            if isinstance(value, np.random.Generator)]


class Checkpoint(Module):
    """Wrap a segment (a Module, typically a Sequential): same forward, same gradients, less memory.

    x: any shape the segment accepts; forward returns the segment's output; backward(dy) returns dx and
    adds the segment's parameter gradients, bitwise equal to the plain segment's.

    After forward the wrapper holds ``x`` (a reference, not a copy — the caller must not overwrite it in
    place) and the generator states; ``recompute_nbytes`` is the size of the activations (beyond x) the
    last recompute held for the duration of backward: the transient cost of checkpointing.
    """

    def __init__(self, segment: Module):
        if not isinstance(segment, Module):
            raise TypeError(f"Checkpoint expects a Module (e.g. a Sequential), got {type(segment).__name__}")
        self.segment = segment
        self._input: np.ndarray | None = None
        self._rng_states: list | None = None
        self._layer_shapes: list | None = None
        self.recompute_nbytes = 0

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: the segment's input, any shape it accepts; returns y, the segment's output."""
        if not isinstance(x, np.ndarray):
            raise TypeError(f"Checkpoint input: expected a numpy array, got {type(x).__name__}")
        self._rng_states = [
            (layer, name, g.bit_generator.state) for layer, name, g in _generators(self.segment)
        ]
        y, saved = self._forward_recording_shapes(x)
        saved.release()  # the point of checkpointing: nothing of the segment's forward survives
        self._input = x
        self.remember_output_shape(y.shape)
        return y

    def _forward_recording_shapes(self, x: np.ndarray) -> tuple[np.ndarray, SavedActivations]:
        # Run the segment layer by layer to note each layer's input shape (a few integers, not the
        # activations) so that flops() can price the segment for the cost model.
        layers = self.segment.layers if isinstance(self.segment, Sequential) else [self.segment]
        before = [(layer, dict(vars(layer))) for layer in self.segment.modules()]
        self._layer_shapes = []
        y = x
        for layer in layers:
            self._layer_shapes.append((layer, y.shape))
            y = layer.forward(y)
        return y, assigned_since(before)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape of y; returns dx, shape of x; adds the segment's parameter gradients
        (bitwise those of the plain segment)."""
        if self._input is None:
            raise RuntimeError("Checkpoint.backward called before forward (or twice for one forward)")
        self.check_upstream(dy)  # before the recompute: a wrong dy changes nothing
        after_forward = [(layer, name, g.bit_generator.state) for layer, name, g in _generators(self.segment)]
        for layer, name, state in self._rng_states:
            getattr(layer, name).bit_generator.state = state  # same draws as forward: same Dropout mask
        buffers = [(layer, name, np.array(getattr(layer, name), copy=True))
                   for layer in self.segment.modules() for name in vars(layer).get("_buffer_names", [])]
        _, saved = self._forward_recording_shapes(self._input)  # the recompute
        for layer, name, value in buffers:
            getattr(layer, name)[...] = value  # running statistics: updated by forward only, not here
        for layer, name, state in after_forward:
            getattr(layer, name).bit_generator.state = state
        self.recompute_nbytes = nbytes_of(self._input, saved.entries) - nbytes_of(self._input)
        dx = self.segment.backward(dy)
        saved.release()
        self._input = None
        return dx

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """Forward FLOPs of the segment, from the layer input shapes seen by the last forward."""
        if self._layer_shapes is None or self._layer_shapes[0][1] != tuple(input_shape):
            raise ValueError(f"Checkpoint.flops({tuple(input_shape)}): run forward on that shape first")
        return sum(forward_flops(layer, shape) for layer, shape in self._layer_shapes)

    def __repr__(self) -> str:
        return f"Checkpoint({self.segment!r})"


def measure_step(model: Module, x: np.ndarray) -> tuple[int, int]:
    """Run one forward and backward (upstream gradient of ones) and measure what checkpointing trades.

    x: the model's input. Returns (peak activation bytes, matrix products executed): the activations the
    model holds (nbytes.py; what the memory ledger's held_bytes(model) counts) at every Linear's backward
    (inside a Checkpoint that includes its recompute), and the products y = x Wᵀ (1 per Linear forward)
    and dX = dY W, dW = dYᵀ X (2 per backward). Every Linear's forward and backward are counted through
    wrappers removed afterwards.
    """
    from .linear import Linear

    if not isinstance(model, Module):
        raise TypeError(f"measure_step expects a minidist Module, got {type(model).__name__}")
    held, products = [0], [0]
    linears = [m for m in model.modules() if isinstance(m, Linear)]

    def counted(run, n, measure):
        def wrapped(a):
            products[0] += n
            if measure:
                held.append(distinct_nbytes(module_arrays(model))["activations"])
            return run(a)
        return wrapped
    for layer in linears:
        layer.forward, layer.backward = counted(layer.forward, 1, False), counted(layer.backward, 2, True)
    try:
        model.backward(np.ones_like(model.forward(x)))
    finally:
        for layer in linears:
            del layer.forward, layer.backward                 # back to the class's methods
    return max(held), products[0]
