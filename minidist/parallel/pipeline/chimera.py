"""Chimera: two pipelines in opposite directions over the same ranks (bidirectional pipeline).

Li and Hoefler 2021, "Chimera: Efficiently Training Large-Scale Neural Networks with Bidirectional
Pipelines"; the "Distributed Deep Learning (Part II)" slides ("Chimera: Bidirectional Pipeline").

    the down pipeline   stage k on rank k;          micro-batches m with (m mod P) <  P/2
    the up pipeline     stage k on rank P − 1 − k;  micro-batches m with (m mod P) >= P/2
    so rank r holds two stages (r and P − 1 − r), each also held by rank P − 1 − r: after the
    backward the two copies' gradients are summed (one exchange per pair) and both step alike

One pipeline's fill is the other's drain. With F and B one tick each (D = P stages, N = M micro-batches):

    bubble fraction  (D − 2) / (2·N + D − 2)             (1F1B: (D − 1) / (N + D − 1))
    activations      rank r holds D/2 + 1 + min(r, D − 1 − r) micro-batches' stage activations at its peak
                     (N = D): between (D/2 + 1) and D, the paper's [(D/2 + 1)·M_a, D·M_a]
    weights          2× (each rank holds two stages)
    cost             one extra exchange of a stage's gradients between rank r and rank P − 1 − r

The table: tick by tick each rank runs a ready B first, else the ready F of the latest stage (the
micro-batch nearest its turn back), ties by micro-batch. P even, M a multiple of P.
"""

from __future__ import annotations

from .schedule import Schedule, check_sizes
from .tasks import Task, greedy_tasks


def chimera_rank(num_stages: int, micro_batch: int, stage: int) -> int:
    """The rank that runs stage of micro_batch: k going down, P − 1 − k going up."""
    P = num_stages
    return stage if micro_batch % P < P // 2 else P - 1 - stage


def chimera_schedule(num_stages: int, num_micro_batches: int) -> Schedule:
    """Chimera for P stages (P even) on P ranks and M micro-batches (a multiple of P)."""
    check_sizes(num_stages, num_micro_batches)
    P, M = num_stages, num_micro_batches
    if P % 2 or M % P:
        raise ValueError(f"Chimera pairs stage k with stage P − 1 − k and sends half of each P micro-batches "
                         f"each way: P must be even and M a multiple of P, got P = {P}, M = {M}")
    tasks: list[list[Task]] = [[] for _ in range(P)]
    for m in range(M):
        for k in range(P):
            r = chimera_rank(P, m, k)
            tasks[r] += [Task(r, "F", m, k), Task(r, "B", m, k)]
    return greedy_tasks(tasks, P, prefer=lambda task: (task.kind != "B", -task.stage, task.micro_batch))


def chimera_bubble(num_stages: int, num_micro_batches: int) -> float:
    """(D − 2) / (2·N + D − 2)."""
    D, N = num_stages, num_micro_batches
    return (D - 2) / (2 * N + D - 2)


def chimera_in_flight(num_stages: int) -> list[int]:
    """Per rank r, the most stage activations held when N = D: D/2 + 1 + min(r, D − 1 − r)."""
    D = num_stages
    return [D // 2 + 1 + min(r, D - 1 - r) for r in range(D)]
