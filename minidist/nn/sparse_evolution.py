"""Sparse evolutionary training (SET; Mocanu et al., "Scalable training of artificial neural networks with
adaptive sparse connectivity inspired by network science", 2018): train a sparse network from the start
and let its connections move. After each epoch, in every masked layer:

    drop   the fraction ζ of the active weights with the smallest |w|
    grow   as many connections at random among the inactive ones (starting at 0, as RigL does;
           SET draws small random values)

so the density never changes while the structure explores. The "Hardware Accelerators for Training DNNs"
tutorial's "Dynamic Sparse Reparametrization" slides put it beside DeepR and Mostafa & Wang's method
("Parameter Efficient Training of Deep Convolutional Neural Networks by Dynamic Sparse
Reparameterization", 2019), which reach the accuracy of pruning after training without a dense phase.
"""

from __future__ import annotations

import numpy as np

from .pruning import Masked


def set_rewire(layer: Masked, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One SET step on ``layer``'s weight mask: drop round(ζ·active) smallest-magnitude active weights,
    grow as many at random inactive positions (not the ones just dropped). Returns the flat indices
    (dropped, grown). The weights dropped become 0; the grown start at 0; the density is unchanged."""
    if not isinstance(layer, Masked):
        raise TypeError(f"set_rewire works on a Masked layer, got {type(layer).__name__}")
    if isinstance(fraction, bool) or not 0 <= fraction <= 1:
        raise ValueError(f"set_rewire: fraction must be in [0, 1], got {fraction!r}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError("set_rewire draws the new connections: pass rng=numpy.random.Generator")
    weight, mask = layer.layer.weight.data, layer.weight_mask.ravel()
    active, inactive = np.flatnonzero(mask), np.flatnonzero(~mask)
    n = min(int(round(fraction * active.size)), inactive.size)
    dropped = active[np.argsort(np.abs(weight.ravel()[active]), kind="stable")[:n]]
    grown = np.sort(rng.choice(inactive, n, replace=False))
    new = mask.copy()
    new[dropped], new[grown] = False, True
    layer.set_masks(new.reshape(weight.shape), layer.bias_mask)
    return dropped, grown
