"""The library's one layer-by-layer backward loop, which the step runner (runner.py) and Sequential.backward
both run: for each layer, last to first, dy = layer.backward(dy), with the runner's attachments' events
around each layer (runner.py's docstring lists them). Its own file so that module.py (Sequential) and
runner.py can both import it without importing each other.
"""

from __future__ import annotations

import numpy as np


def backward_through(layers: list, dy: np.ndarray, attachments: list = (), input_grad: bool = True,
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


def backward_without_dx(layer, dy: np.ndarray) -> None:
    """Backward of a layer whose input needs no gradient: only its parameters' gradients.

    Layers with an ``input_grad`` switch (Linear, Conv2d, the tensor-parallel linears) skip the dx product;
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
