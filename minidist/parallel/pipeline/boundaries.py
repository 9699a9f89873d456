"""Cutting a Sequential into P pipeline stages: by layer count, or balanced by FLOPs.

Stage s gets layers[b[s] : b[s+1]] for boundaries b = [0, b_1, ..., b_{P−1}, L], strictly increasing, so
every stage has at least one layer. A pipeline runs at the pace of its slowest stage (the HOT CHIPS
tutorial "Fundamentals of Scaling out DL Training": "difficult to 'load balance' across all the
workers"), so the FLOP-balanced split minimises the largest stage cost  max_s Σ_{l in stage s} cost_l
(a small dynamic programme over (layers used, stages used)). By count: minidist.collectives.pieces's sizes.
"""

from __future__ import annotations

import copy

import numpy as np

from minidist.collectives.pieces import split_offsets
from minidist.nn.checkpoint import forward_flops
from minidist.nn.checks import check_count, is_count
from minidist.nn.module import Sequential


def check_boundaries(boundaries, num_layers: int, num_stages: int) -> list[int]:
    """Return boundaries as a list of ints, or raise ValueError saying what a valid split looks like."""
    b = list(boundaries)
    valid = (num_stages >= 1 and len(b) == num_stages + 1 and all(is_count(v, 0) for v in b)
             and b[0] == 0 and b[-1] == num_layers and all(b[i] < b[i + 1] for i in range(num_stages)))
    if not valid:
        raise ValueError(f"stage boundaries {b} do not split {num_layers} layers into {num_stages} stages: "
                         f"expected {num_stages + 1} strictly increasing integers from 0 to {num_layers}")
    return [int(v) for v in b]


def _check_count(num_layers: int, num_stages: int) -> None:
    check_count(num_stages, "number of stages")
    if num_stages > num_layers:
        raise ValueError(f"cannot split {num_layers} layers into {num_stages} stages: "
                         "every stage needs a layer")


def split_by_layers(num_layers: int, num_stages: int) -> list[int]:
    """Boundaries giving each stage ⌊L/P⌋ or ⌈L/P⌉ layers (the first stages take the extra ones)."""
    _check_count(num_layers, num_stages)
    return split_offsets(num_layers, num_stages).tolist()


def layer_costs(model: Sequential, sample: np.ndarray) -> list[int]:
    """Forward FLOPs of each layer for an input like sample (run on a copy: the model is not touched)."""
    if not isinstance(model, Sequential):
        raise TypeError(f"a pipeline splits a Sequential, got {type(model).__name__}")
    x, costs = sample, []
    for layer in copy.deepcopy(model).layers:
        y = layer.forward(x)
        costs.append(forward_flops(layer, x.shape))
        x = y
    return costs


def split_by_cost(costs: list[int], num_stages: int) -> list[int]:
    """Boundaries minimising the most expensive stage (ties: the earliest cut), by dynamic programming.

    best[k][j] = the smallest possible max-stage-cost putting layers[:j] into k stages.
    """
    L = len(costs)
    _check_count(L, num_stages)
    prefix = np.concatenate([[0], np.cumsum(costs)])
    inf = float("inf")
    best = [[inf] * (L + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (L + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0
    for k in range(1, num_stages + 1):
        for j in range(k, L + 1):
            for i in range(k - 1, j):  # the last stage holds layers[i:j]
                cost = max(best[k - 1][i], prefix[j] - prefix[i])
                if cost < best[k][j]:
                    best[k][j], cut[k][j] = cost, i
    boundaries = [L]
    for k in range(num_stages, 0, -1):
        boundaries.append(cut[k][boundaries[-1]])
    return boundaries[::-1]


def stage_costs(costs: list[int], boundaries: list[int]) -> list[int]:
    """Σ of the layer costs in each stage."""
    return [int(sum(costs[boundaries[s]:boundaries[s + 1]])) for s in range(len(boundaries) - 1)]
