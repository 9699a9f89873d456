"""Pieces of data parallelism that need no communication: which layers backward runs one by one and
their input shapes, the forward's charge to the simulated clock, and the loss weight that makes the
shards' gradients add up to the full-batch gradient (see data_parallel.py). Which slice of the global
batch a rank takes is minidist.split's rule: split_range(B, P, rank)."""

from __future__ import annotations

import numpy as np

from minidist.cluster import Span
from minidist.nn.module import Module, Sequential


def leaf_layers(model: Module) -> list[Module]:
    """The layers backward runs one by one: a Sequential's layers (nested Sequentials flattened), or
    the model itself."""
    if isinstance(model, Sequential):
        return [leaf for layer in model for leaf in leaf_layers(layer)]
    return [model]


def input_shapes(model: Module, layers: list[Module], x_shape: tuple, cache: dict) -> list[tuple]:
    """Each layer's input shape for a batch of shape x_shape (B, ...), found once per feature shape by a
    one-example forward in eval mode (kept in ``cache``); the model's modes are restored."""
    key = tuple(x_shape[1:])
    if key not in cache:
        modes = [(m, m.training) for m in model.modules()]
        model.eval()
        h, shapes = np.zeros((1, *key), dtype=model.parameters()[0].data.dtype), []
        try:
            for layer in layers:
                shapes.append(h.shape[1:])
                h = layer.forward(h)
        finally:
            for m, mode in modes:
                m.training = mode
        cache[key] = shapes
    return [(x_shape[0], *shape) for shape in cache[key]]


def charge_forward(comm, layers: list[Module], shapes: list[tuple], spans: list[Span]) -> list[float]:
    """Charge every layer's forward FLOPs (for its input shape) to comm's simulated clock, record a
    compute span for each in ``spans``, and return each layer's forward time in seconds."""
    times = []
    for layer, shape in zip(layers, shapes):
        start = comm.clock
        flops = layer.flops(shape) if callable(getattr(layer, "flops", None)) else 0
        comm.compute(flops, label=f"forward {type(layer).__name__}")
        spans.append(Span(comm.rank, start, comm.clock, "compute", f"forward {type(layer).__name__}"))
        times.append(comm.clock - start)
    return times


class ShardWeightedLoss:
    """A loss whose backward is scaled by ``weight`` = n_r / B: the gradient of Σ_{i∈r} ℓ_i / B."""

    def __init__(self, loss_fn, weight: float):
        self.loss_fn, self.weight = loss_fn, weight

    def forward(self, logits: np.ndarray, target: np.ndarray) -> float:
        """logits: the shard's outputs, (n_r, ...); target: its targets, (n_r, ...). Returns the mean loss."""
        return self.loss_fn.forward(logits, target)

    def backward(self) -> np.ndarray:
        """Returns weight · dloss/dlogits, shape (n_r, ...) like the logits."""
        grad = self.loss_fn.backward()
        return grad if self.weight == 1.0 else grad * self.weight
