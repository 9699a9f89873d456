"""Zero-bubble pipeline (ZB-H1): the backward split into B (input gradient) and W (weight gradient).

Qi et al. 2023, "Zero Bubble Pipeline Parallelism". A layer's backward is two products: dx = dy·W, which
the previous stage waits for, and dW = dyᵀ·x, which nobody waits for. Running B at once and W later lets
the W's fill the ticks where 1F1B idles. With F, B and W one tick each (T_F = T_B = T_W):

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

