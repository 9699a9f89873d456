"""The sum of partial gradients: grad = Σ over each group in ``p.partial_over`` of grad.

A split model marks a replicated parameter whose gradient covers only this rank's tokens, positions,
rows or image block as *partial* over a group (``nn.Parameter.partial_over``: tensor + sequence, context,
expert and spatial parallelism); one all-reduce per group completes it. This is the by-hand form of the
gradient sync attachment's partial sums (minidist.parallel.data.GradientSync), for loops that run forward
and backward themselves: call it once per step, after the last backward (it sums the whole ``grad``).
Cost per group: one all-reduce of the concatenated gradients, 2(P−1)/P·n words per rank.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.allreduce import allreduce
from minidist.collectives.primitives import pairwise_allreduce


def sum_partial_gradients(params, algorithm: str = "pairwise") -> None:
    """For every Parameter p of ``params`` and every group in ``p.partial_over`` (in order): p.grad = Σ over
    the group of p.grad, bitwise the same on its ranks. One flat all-reduce per group: ``pairwise_allreduce``
    (reduce-scatter + all-gather), or ``allreduce(comm, x, algorithm=algorithm)`` ("ring", "tree", ...)."""
    groups: dict[int, tuple] = {}
    for p in params:
        for comm in p.partial_over:
            groups.setdefault(id(comm), (comm, []))[1].append(p)
    for comm, members in groups.values():
        if comm.world_size == 1:
            continue
        flat = np.concatenate([p.grad.ravel() for p in members])
        total = pairwise_allreduce(comm, flat) if algorithm == "pairwise" else \
            allreduce(comm, flat, algorithm=algorithm)
        offset = 0
        for p in members:
            p.grad[...] = total[offset:offset + p.grad.size].reshape(p.grad.shape)
            offset += p.grad.size
