"""Pieces for tests that reach exactly one exercise region (an exercise's *own* tests).

A test of a parallel strategy normally trains a model of Linear layers with CrossEntropyLoss and the
ring allreduce, and so reaches four exercises at once. The own tests use pieces that are not exercises:
``Affine`` (an element-wise y = x·a + b, written here), Tanh, MSELoss, plain SGD (no momentum), and the
allreduce algorithms that are not exercises (naive, recursive_doubling, rabenseifner).
"""

from __future__ import annotations

import math

import numpy as np

from minidist.nn import Module, Parameter, Sequential, Tanh

NON_EXERCISE_ALGORITHMS = ("naive", "recursive_doubling", "rabenseifner")


class Affine(Module):
    """Element-wise affine layer over the last axis: y = x·scale + shift.

    x: (..., F) → y: (..., F); scale, shift: (F,). Backward: dx = dy·scale,
    d scale = Σ dy·x, d shift = Σ dy (sums over every axis but the last).
    """

    def __init__(self, features: int, *, rng: np.random.Generator, dtype=np.float64):
        self.features = features
        self.scale = Parameter(rng.uniform(0.5, 1.5, features).astype(dtype))
        self.shift = Parameter(rng.normal(0.0, 0.3, features).astype(dtype))
        self._x: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        if x.shape[-1] != self.features:
            raise ValueError(f"Affine expects input (..., {self.features}), got {x.shape}")
        self._x = x
        return x * self.scale.data + self.shift.data

    def backward(self, dy: np.ndarray) -> np.ndarray:
        if self._x is None:
            raise RuntimeError("Affine.backward called before forward")
        if dy.shape != self._x.shape:
            raise ValueError(f"Affine.backward expects dy of shape {self._x.shape}, got {dy.shape}")
        self.scale.grad += (dy * self._x).reshape(-1, self.features).sum(axis=0)
        self.shift.grad += dy.reshape(-1, self.features).sum(axis=0)
        return dy * self.scale.data

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return 2 * math.prod(input_shape)


def affine_model(features: int, depth: int, seed: int, dtype=np.float64) -> Sequential:
    """Affine, Tanh, Affine, Tanh, ... (depth Affine layers): the same values from the same seed."""
    rng = np.random.default_rng(seed)
    layers: list[Module] = []
    for i in range(depth):
        layers.append(Affine(features, rng=rng, dtype=dtype))
        if i < depth - 1:
            layers.append(Tanh())
    return Sequential(*layers)


def regression_batches(
    seed: int, steps: int, batch: int, features: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``steps`` (x, target) pairs of shape (batch, features), float64."""
    rng = np.random.default_rng([seed, 11])
    return [(rng.normal(size=(batch, features)), rng.normal(size=(batch, features))) for _ in range(steps)]


def integer_arrays(seed: int, world_size: int, n: int, dtype=np.float64) -> list[np.ndarray]:
    """One integer-valued array of n elements per rank (values in [-8, 8]: every sum is exact)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-8, 9, size=n).astype(dtype) for _ in range(world_size)]
