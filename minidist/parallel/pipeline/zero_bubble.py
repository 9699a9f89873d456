"""Zero-bubble pipeline (ZB-H1): the backward split into B (input gradient) and W (weight gradient).

Qi et al. 2023, "Zero Bubble Pipeline Parallelism". A linear layer's backward is two products:

    B   dx = dy · W          (N, in)    the previous stage waits for it
    W   dW = dyᵀ · x         (out, in)  nobody waits for it: it can run whenever a rank would idle
        db = Σ_n dy[n]       (out,)

``DeferredWeightGrad`` splits a Linear so: B keeps (x, dy) for W; each costs one forward's FLOPs
(2·N·in·out); B + W is the plain backward, product for product (other layers do their whole backward in
B). Running B at once and W later lets the W's fill the ticks where 1F1B idles. With F, B and W one tick
each (T_F = T_B = T_W):

    1F1B (B and W together, 2 ticks)  bubble (P − 1)·(T_F + T_B + T_W) per stage
    ZB-H1                             bubble (P − 1)·(T_F + T_B − T_W): one third of it here;
                                      bubble fraction (P − 1) / (3·M + P − 1)      (M ≥ P)
    activations                       stage s holds at most P − s micro-batches from F to B, as 1F1B;
                                      between B and W only the inputs and output gradients of the
                                      layers' products (what W multiplies) stay

The table: each stage, tick by tick, runs a ready B first, else an F if it holds fewer than P − s
micro-batches, else the oldest W — W waits for a tick nothing else can use.
"""

from __future__ import annotations

import numpy as np

from minidist.nn.linear import Linear
from minidist.nn.module import Module

from .schedule import Schedule, check_sizes
from .tasks import Task, greedy_tasks

_FIRST = {"B": 0, "F": 1, "W": 2}


def zero_bubble_schedule(num_stages: int, num_micro_batches: int) -> Schedule:
    """ZB-H1 for P stages (stage s on rank s) and M micro-batches: F, B (input gradient), W (weights)."""
    check_sizes(num_stages, num_micro_batches)
    P, M = num_stages, num_micro_batches
    tasks = [[Task(s, kind, m, s) for m in range(M) for kind in "FBW"] for s in range(P)]
    return greedy_tasks(tasks, P, prefer=lambda task: (_FIRST[task.kind], task.micro_batch),
                        limit=[P - s for s in range(P)])


def zero_bubble_bubble(num_stages: int, num_micro_batches: int) -> float:
    """(P − 1) / (3·M + P − 1) with F, B and W one tick each (M ≥ P)."""
    P, M = num_stages, num_micro_batches
    return (P - 1) / (3 * M + P - 1)


class DeferredWeightGrad(Module):
    """Wraps a Linear (sharing its Parameters): backward(dy) returns dx only, leaving (x, dy) in ``pending``
    for ``weight_grad(pending)`` (dW, db); B is charged one forward's FLOPs (``backward_factor``)."""

    backward_factor = 1

    def __init__(self, linear: Linear):
        if not isinstance(linear, Linear):
            raise TypeError(f"only a Linear splits its backward here, got {type(linear).__name__}")
        self.linear = linear
        self.pending: tuple[np.ndarray, np.ndarray] | None = None

    def flops(self, input_shape: tuple[int, ...]) -> int:
        return self.linear.flops(input_shape)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x (..., in) -> y (..., out), as the wrapped Linear."""
        return self.linear.forward(x)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """B: dy (..., out) -> dx (..., in); the parameters' gradients wait in ``pending`` for W."""
        lin = self.linear
        lin.check_upstream(dy)
        dy2d = dy.reshape(-1, lin.out_features)
        self.pending = (lin._x2d, dy2d)
        return (dy2d @ lin.weight.data).reshape(*dy.shape[:-1], lin.in_features)

    def weight_grad(self, pending: tuple[np.ndarray, np.ndarray]) -> None:
        """W: add dW = dyᵀ·x and db = Σ dy for the (x, dy) a B kept."""
        x2d, dy2d = pending
        self.linear.weight.grad += dy2d.T @ x2d
        if self.linear.bias is not None:
            self.linear.bias.grad += dy2d.sum(axis=0)
