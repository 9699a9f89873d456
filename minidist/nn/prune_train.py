"""Group lasso and PruneTrain-style channel removal: the layers themselves get smaller during training.

Group lasso (Wen et al., "Learning Structured Sparsity in Deep Neural Networks"; Meier et al.) adds
λ Σ_g ‖w_g‖₂ to the loss, one group per output channel: g = (filter weight[o], bias[o]). Its proximal
step after each SGD step with learning rate γ is block soft-thresholding:
    w_g ← max(0, 1 − γλ / ‖w_g‖₂) · w_g,
which sets a whole group to exactly 0 as soon as ‖w_g‖₂ <= γλ. A subgradient step instead adds
γλ·w_g/‖w_g‖₂ to the update: a step of fixed length γλ towards 0 that overshoots and oscillates
around it — the group gets small but never exactly zero, and only exact zeros can be cut out.

Channel removal (PruneTrain, Lym et al., "PruneTrain: Fast Neural Network Training by Dynamic Sparse
Model Reconfiguration"): channel c between a producer layer (the Conv2d/Linear that writes it) and the
consumer (the next one, which reads it) is removable when
  * its producer group is zero (filter and bias): the channel holds exactly 0 after ReLU and pooling, or
  * its consumer's weights reading c are all zero: nothing reads it.
It then leaves *both* arrays — the producer's output rows and the consumer's input columns ("channel
union": no index arrays, just smaller dense layers), so the FLOPs of every later step fall. With
shortcut connections several layers share one channel index and all of them must agree; this module
handles a residual-free Sequential (Conv2d/Linear with ReLU, pooling, Dropout, Flatten between them).
Source: "Hardware Accelerators for Training Deep Neural Networks" tutorial, chapter "Sparsity".
"""

from __future__ import annotations

import math

import numpy as np

from .activation import Dropout, ReLU
from .conv import AvgPool2d, Conv2d, Flatten, MaxPool2d
from .linear import Linear
from .module import Module, Parameter, Sequential

#: layers between a producer and a consumer that map an all-zero channel to an all-zero channel
ZERO_PRESERVING = (ReLU, MaxPool2d, AvgPool2d, Dropout, Flatten)


def output_groups(layer: Module) -> list[np.ndarray]:
    """Per output channel o, the group (weight[o] flattened, bias[o]) as one vector: O arrays."""
    if not isinstance(layer, (Linear, Conv2d)):
        raise TypeError(f"group lasso needs a Linear or Conv2d, got {type(layer).__name__}")
    rows = layer.weight.data.reshape(layer.weight.shape[0], -1)
    if layer.bias is None:
        return list(rows)
    return list(np.concatenate([rows, layer.bias.data[:, None]], axis=1))


def group_norms(layer: Module) -> np.ndarray:
    """‖w_g‖₂ of every output-channel group of a Linear/Conv2d, shape (O,)."""
    return np.array([np.linalg.norm(g) for g in output_groups(layer)])


def group_lasso_penalty(layers: list[Module], strength: float) -> float:
    """λ Σ_layers Σ_g ‖w_g‖₂ (to add to the loss when printing it)."""
    return float(strength * sum(group_norms(layer).sum() for layer in layers))


def group_lasso_prox(layers: list[Module], strength: float, lr: float) -> int:
    """Block soft-thresholding of every output-channel group, in place; returns how many groups are 0.

    layers: Linear/Conv2d layers;  strength: λ >= 0;  lr: γ >= 0, the step size of the SGD step just taken.
    """
    if strength < 0 or lr < 0:
        raise ValueError(f"group_lasso_prox needs strength >= 0 and lr >= 0, got {strength}, {lr}")
    threshold, zero_groups = strength * lr, 0
    for layer in layers:
        norms = group_norms(layer)
        with np.errstate(divide="ignore"):
            scale = np.where(norms > threshold, 1.0 - threshold / np.where(norms > 0, norms, 1.0), 0.0)
        scale = scale.astype(layer.weight.data.dtype)
        layer.weight.data *= scale.reshape((-1,) + (1,) * (layer.weight.data.ndim - 1))
        if layer.bias is not None:
            layer.bias.data *= scale
        zero_groups += int((scale == 0).sum())
    return zero_groups


def _pairs(model: Sequential) -> list[tuple[Module, Module, int]]:
    """(producer, consumer, features per channel in the consumer) for each consecutive pair of layers."""
    if not isinstance(model, Sequential):
        raise TypeError(f"expected a Sequential, got {type(model).__name__}")
    found: list[Module] = []
    for layer in model.layers:
        if isinstance(layer, (Linear, Conv2d)):
            found.append(layer)
        elif not isinstance(layer, ZERO_PRESERVING):
            raise TypeError(
                f"channel removal handles Conv2d/Linear with {[t.__name__ for t in ZERO_PRESERVING]}"
                f" between them; {type(layer).__name__} may turn a zero channel into non-zeros"
            )
    pairs = []
    for producer, consumer in zip(found, found[1:]):
        channels = producer.weight.shape[0]
        if isinstance(consumer, Conv2d):
            if not isinstance(producer, Conv2d):
                raise TypeError("a Linear followed by a Conv2d is not a CNN this module can shrink")
            per_channel = 1
        else:
            per_channel, rest = divmod(consumer.in_features, channels)
            if rest:
                raise ValueError(f"{consumer!r} reads {consumer.in_features} features, not a multiple of "
                                 f"the {channels} channels before it")
        pairs.append((producer, consumer, per_channel))
    return pairs


def _consumer_columns(consumer: Module, channels: int, per_channel: int) -> np.ndarray:
    """The consumer's weight as (channels, everything that reads one channel)."""
    w = consumer.weight.data
    if isinstance(consumer, Conv2d):
        return w.transpose(1, 0, 2, 3).reshape(channels, -1)
    # Flatten of NCHW is channel-major: feature c·H·W + h·W + w belongs to channel c
    return w.reshape(w.shape[0], channels, per_channel).transpose(1, 0, 2).reshape(channels, -1)


def removable_channels(model: Sequential) -> list[np.ndarray]:
    """Per producer/consumer pair, a bool vector (channels,): True where the channel can be cut out."""
    result = []
    for producer, consumer, per_channel in _pairs(model):
        channels = producer.weight.shape[0]
        produced = np.stack(output_groups(producer))
        read = _consumer_columns(consumer, channels, per_channel)
        result.append(~produced.any(axis=1) | ~read.any(axis=1))
    return result


def _take(p: Parameter, index: np.ndarray, axis: int, states: list[dict]) -> None:
    """Keep ``index`` along ``axis`` of p.data, p.grad and every optimizer state array of p."""
    old_shape = p.data.shape
    p.data = np.ascontiguousarray(np.take(p.data, index, axis=axis))
    p.grad = np.ascontiguousarray(np.take(p.grad, index, axis=axis))
    for state in states:
        for name, array in state.items():
            if array.shape == old_shape:
                state[name] = np.ascontiguousarray(np.take(array, index, axis=axis))
            elif array.shape[1:] == old_shape:  # one stored copy per sample (SAG)
                state[name] = np.ascontiguousarray(np.take(array, index, axis=axis + 1))
            else:
                raise ValueError(
                    f"optimizer state {name!r} of shape {array.shape} does not match {old_shape}"
                )


def shrink_channels(model: Sequential, optimizer=None) -> list[int]:
    """Cut every removable channel out of the producer's and the consumer's arrays, in place.

    The Parameters stay the same objects (their .data/.grad become smaller arrays), so an optimizer keeps
    working; its per-parameter state arrays are cut alike. Returns the channels left per pair. Raises
    ValueError, changing nothing, if a pair would lose all its channels.
    """
    pairs, removable = _pairs(model), removable_channels(model)
    for (producer, _, _), dead in zip(pairs, removable):
        if dead.all():
            raise ValueError(f"every one of the {dead.size} channels after {producer!r} is zero; removing "
                             f"them all would cut the network in two")
    states = {}
    if optimizer is not None:
        states = {id(p): s for p, s in zip(optimizer.params, optimizer.state)}
    left = []
    for (producer, consumer, per_channel), dead in zip(pairs, removable):
        keep = np.flatnonzero(~dead)
        for p in (producer.weight, producer.bias):
            if p is not None:
                _take(p, keep, 0, [states[id(p)]] if id(p) in states else [])
        columns = keep if per_channel == 1 else (keep[:, None] * per_channel + np.arange(per_channel)).ravel()
        _take(
            consumer.weight,
            columns,
            1,
            [states[id(consumer.weight)]] if id(consumer.weight) in states else [],
        )
        if isinstance(producer, Conv2d):
            producer.out_channels = keep.size
        else:
            producer.out_features = keep.size
        if isinstance(consumer, Conv2d):
            consumer.in_channels = keep.size
        else:
            consumer.in_features = columns.size
        left.append(int(keep.size))
    return left


def training_flops(model: Sequential, input_shape: tuple[int, ...]) -> int:
    """FLOPs of one training step on a batch of ``input_shape``: 3 × the forward FLOPs of every layer
    (backward costs about two forwards: one product for dx, one for dW)."""
    shape, total = tuple(input_shape), 0
    for layer in model.layers:
        total += layer.flops(shape)
        layer = getattr(layer, "layer", layer)  # a Masked layer has the shapes of the one it wraps
        if hasattr(layer, "output_shape"):
            shape = layer.output_shape(shape)
        elif isinstance(layer, Linear):
            shape = (*shape[:-1], layer.out_features)
        elif isinstance(layer, Flatten):
            shape = (shape[0], math.prod(shape[1:]))
    return 3 * total
