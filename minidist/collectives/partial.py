"""The sum of partial gradients: grad = Σ over each group in ``p.partial_over`` of grad.

A split model marks a replicated parameter whose gradient covers only this rank's tokens, positions,
rows or image block as *partial* over a group (``nn.Parameter.partial_over``: tensor + sequence, context,
expert and spatial parallelism); one all-reduce per group completes it. This is the by-hand form of the
gradient sync attachment's partial sums (minidist.parallel.data.GradientSync), for loops that run forward
and backward themselves: call it once per step, after the last backward (it sums the whole ``grad``);
an optimizer refuses to step on a parameter whose partial sum has not run since its last backward.
Cost per group: one all-reduce of the concatenated gradients, 2(P−1)/P·n words per rank.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.allreduce import allreduce
from minidist.collectives.primitives import pairwise_allreduce


def sum_gradients(comm, params, algorithm: str = "pairwise") -> None:
    """p.grad = Σ over ``comm``'s ranks of p.grad for every Parameter p of ``params`` (one dtype), bitwise the
    same on every rank: ONE all-reduce of their concatenation — ``pairwise_allreduce`` (reduce-scatter +
    all-gather), or ``allreduce(comm, x, algorithm=algorithm)`` ("ring", "tree", ...)."""
    params = list(params)
    if comm.world_size == 1 or not params:
        return
    flat = np.concatenate([p.grad.ravel() for p in params])
    if algorithm == "pairwise":
        total = pairwise_allreduce(comm, flat)
    else:
        total = allreduce(comm, flat, algorithm=algorithm)
    offset = 0
    for p in params:
        p.grad[...] = total[offset:offset + p.grad.size].reshape(p.grad.shape)
        offset += p.grad.size


def sum_partial_gradients(params, algorithm: str = "pairwise") -> None:
    """For every Parameter p of ``params`` and every group in ``p.partial_over``: p.grad = Σ over the group of
    p.grad — ``sum_gradients`` once per group, over the parameters partial over it. A parameter's groups are
    different axes of one grid (tensor, context, expert, ...), so the order of the sums does not matter.

    Then each p's gradient is whole: ``p.partial_pending`` is cleared (every layer's ``p.grad += dW`` sets it,
    and optimizers refuse a pending parameter: minidist.nn.Parameter)."""
    params = list(params)
    groups: dict[int, tuple] = {}
    for p in params:
        for comm in p.partial_over:
            groups.setdefault(id(comm), (comm, []))[1].append(p)
    for comm, members in groups.values():
        sum_gradients(comm, members, algorithm)
    for p in params:
        p.partial_pending = False
