"""Pruning: magnitude (unstructured) and channel (structured) masks, a masked layer, gradual schedules.

Magnitude pruning keeps the largest weights:  m_i = 0 for the round(s·n) smallest |w_i|, else 1, and the
layer computes with w ⊙ m. A mask must stay applied through training: ``Masked`` multiplies the
weight by m before every forward and the gradient by m after every backward (so ∂L/∂w_i = 0 where
m_i = 0), and ``minidist.optim.MaskedOptimizer`` re-applies m after every optimizer step (momentum, Adam's
moments or weight decay would otherwise move a pruned weight off zero).

Channel (structured) pruning removes whole filters: output channel o of a Conv2d (O, C, kh, kw) or a
Linear (O, I) is ranked by the L2 norm of weight[o], and filter and bias of the weakest go together, so
the channel holds exactly 0 and can later be cut out of the arrays (minidist.nn.prune_train).

Gradual pruning (Zhu & Gupta, "To prune, or not to prune"): the sparsity after step t is
    s_t = s_f + (s_i − s_f)·(1 − (t − t_0)/(t_1 − t_0))³   for t_0 <= t <= t_1,
s_i before t_0 and s_f after t_1: prune fast while many redundant weights remain, slowly at the end.
Source: "Hardware Accelerators for Training Deep Neural Networks" tutorial, chapter "Sparsity".
"""

from __future__ import annotations

import numpy as np

from .conv import Conv2d
from .linear import Linear
from .module import Module, Sequential, check_float_array

STRUCTURES = ("weights", "channels")


def check_sparsity(sparsity, what: str = "sparsity") -> float:
    """Return sparsity as a float, or raise: it must be a real number in [0, 1)."""
    if isinstance(sparsity, (bool, np.bool_)) or not isinstance(
        sparsity, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"{what} must be a number in [0, 1), got {sparsity!r}")
    if not 0.0 <= float(sparsity) < 1.0:
        raise ValueError(f"{what} must lie in [0, 1) (1 would remove everything), got {sparsity!r}")
    return float(sparsity)


def magnitude_mask(weight: np.ndarray, sparsity: float) -> np.ndarray:
    """Keep-mask of unstructured magnitude pruning: False at the round(sparsity·n) smallest |w|.

    weight: any float array, shape S;  returns a bool array of shape S. Equal magnitudes are pruned in
    flat index order (a stable sort), so the mask is reproducible.
    """
    check_float_array(weight, "magnitude_mask weight")
    sparsity = check_sparsity(sparsity)
    # BEGIN SOLUTION magnitude_prune
    # BEGIN PROMPT
    # Hint: k = round(sparsity · n) weights go. Sort |w| flattened with a *stable* argsort (equal
    # magnitudes go in index order), set those k positions of an all-True mask to False, reshape.
    # END PROMPT
    n_pruned = round(sparsity * weight.size)
    order = np.argsort(np.abs(weight), axis=None, kind="stable")  # smallest magnitude first
    keep = np.ones(weight.size, dtype=bool)
    keep[order[:n_pruned]] = False
    return keep.reshape(weight.shape)
    # END SOLUTION


def channel_mask(weight: np.ndarray, fraction: float) -> np.ndarray:
    """Keep-vector (O,) of structured pruning: False for the round(fraction·O) filters of least L2 norm.

    weight: (O, C, kh, kw) or (O, I). Raises ValueError if no channel would remain.
    """
    check_float_array(weight, "channel_mask weight", ndim=(2, 4))
    fraction = check_sparsity(fraction, "channel fraction")
    n_out = weight.shape[0]
    n_pruned = round(fraction * n_out)
    if n_pruned >= n_out:
        raise ValueError(f"pruning {fraction:g} of {n_out} channels leaves none; at least one must remain")
    norms = np.sqrt((weight.reshape(n_out, -1).astype(np.float64) ** 2).sum(axis=1))
    keep = np.ones(n_out, dtype=bool)
    keep[np.argsort(norms, kind="stable")[:n_pruned]] = False
    return keep


def cubic_sparsity(step: int, final_sparsity: float, begin_step: int, end_step: int,
                   initial_sparsity: float = 0.0) -> float:
    """Zhu & Gupta's gradual schedule s_t (see the module docstring); steps are counted from 0."""
    final_sparsity, initial_sparsity = check_sparsity(final_sparsity), check_sparsity(initial_sparsity)
    if not 0 <= begin_step < end_step:
        raise ValueError(f"cubic_sparsity needs 0 <= begin_step < end_step, got {begin_step}, {end_step}")
    if step <= begin_step:
        return initial_sparsity
    if step >= end_step:
        return final_sparsity
    progress = (step - begin_step) / (end_step - begin_step)
    return final_sparsity + (initial_sparsity - final_sparsity) * (1.0 - progress) ** 3


class Masked(Module):
    """A Linear or Conv2d that computes with weight ⊙ weight_mask (and bias ⊙ bias_mask).

    structure: "weights" (magnitude masks) or "channels" (whole filters with their bias); it decides what
    ``prune_to(sparsity)`` recomputes. The wrapped layer keeps its own Parameters (``parameters()``
    lists them as ``layer.weight``, ``layer.bias``).
    """

    def __init__(self, layer: Module, structure: str = "weights"):
        if not isinstance(layer, (Linear, Conv2d)):
            raise TypeError(f"Masked wraps a Linear or Conv2d, got {type(layer).__name__}")
        if structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {STRUCTURES}, got {structure!r}")
        self.layer, self.structure = layer, structure
        self.weight_mask = np.ones(layer.weight.shape, dtype=bool)
        self.bias_mask = None if layer.bias is None else np.ones(layer.bias.shape, dtype=bool)

    def set_masks(self, weight_mask: np.ndarray, bias_mask: np.ndarray | None = None) -> None:
        """Replace the masks (bool arrays of the weight's / bias's shape) and zero what they remove."""
        weight_mask = np.asarray(weight_mask)
        if weight_mask.dtype != bool or weight_mask.shape != self.layer.weight.shape:
            raise ValueError(f"weight_mask must be a bool array of shape {self.layer.weight.shape}, got "
                             f"{weight_mask.dtype} {weight_mask.shape}")
        if bias_mask is None:
            bias_mask = None if self.layer.bias is None else np.ones(self.layer.bias.shape, dtype=bool)
        elif self.layer.bias is None or np.asarray(bias_mask).shape != self.layer.bias.shape \
                or np.asarray(bias_mask).dtype != bool:
            raise ValueError(f"bias_mask must be a bool array of the bias's shape "
                             f"{None if self.layer.bias is None else self.layer.bias.shape}")
        self.weight_mask, self.bias_mask = weight_mask.copy(), None if bias_mask is None else bias_mask.copy()
        self.apply_masks()

    def prune_to(self, sparsity: float) -> None:
        """Recompute the masks from the current (masked) weights: magnitude or channel pruning."""
        weight = self.layer.weight.data
        if self.structure == "weights":
            self.set_masks(magnitude_mask(weight, sparsity) & self.weight_mask, self.bias_mask)
            return
        keep = channel_mask(weight, sparsity)
        shape = (-1,) + (1,) * (weight.ndim - 1)
        self.set_masks(np.broadcast_to(keep.reshape(shape), weight.shape).copy(),
                       None if self.layer.bias is None else keep)

    def masks(self) -> list[tuple[object, np.ndarray]]:
        """[(Parameter, its keep-mask)] for the weight and, if any, the bias."""
        pairs = [(self.layer.weight, self.weight_mask)]
        if self.bias_mask is not None:
            pairs.append((self.layer.bias, self.bias_mask))
        return pairs

    def apply_masks(self) -> None:
        """Set the removed weights (and their gradients) to +0.0 exactly."""
        for p, mask in self.masks():
            p.data[~mask] = 0
            p.grad[~mask] = 0

    def forward(self, x: np.ndarray) -> np.ndarray:
        for p, mask in self.masks():
            p.data[~mask] = 0  # w ⊙ m, whatever changed the weights since
        return self.layer.forward(x)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        dx = self.layer.backward(dy)
        for p, mask in self.masks():
            p.grad[~mask] = 0  # ∂L/∂w_i = 0 where m_i = 0: the forward used w_i·0
        return dx

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """The dense layer's FLOPs: a masked layer still multiplies its zeros (see shrink_channels)."""
        return self.layer.flops(input_shape)

    def sparsity(self) -> float:
        """Fraction of the weight's entries that the mask removes."""
        return float(1.0 - self.weight_mask.mean())

    def __repr__(self) -> str:
        return f"Masked({self.layer!r}, structure={self.structure!r}, sparsity={self.sparsity():.3f})"


def prune(model: Sequential, sparsity: float, structure: str = "weights") -> list[Masked]:
    """Wrap every *hidden* Linear/Conv2d of model (all but the last, whose outputs are the classes) in
    ``Masked``, in place, pruned to ``sparsity``; returns the wrappers (already wrapped ones are re-pruned).
    """
    if not isinstance(model, Sequential):
        raise TypeError(f"prune expects a Sequential, got {type(model).__name__}")
    check_sparsity(sparsity)
    positions = [i for i, layer in enumerate(model.layers) if isinstance(layer, (Linear, Conv2d, Masked))]
    if len(positions) < 2:
        raise ValueError("prune needs at least one hidden Linear/Conv2d before the output layer")
    wrappers = []
    for i in positions[:-1]:
        layer = model.layers[i]
        if not isinstance(layer, Masked):
            layer = model.layers[i] = Masked(layer, structure)
        layer.prune_to(sparsity)
        wrappers.append(layer)
    return wrappers


def unwrap(model: Sequential) -> Sequential:
    """Replace every Masked layer of model by the layer it wraps (whose pruned weights are zero), in place."""
    for i, layer in enumerate(model.layers):
        if isinstance(layer, Masked):
            layer.apply_masks()
            model.layers[i] = layer.layer
    return model
