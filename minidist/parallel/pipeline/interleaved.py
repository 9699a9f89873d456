"""Interleaved 1F1B: v virtual stages (model chunks) per rank.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", section 2.2.2. The model is cut into S = v·P stages; rank r holds stages r, r + P, ...,
r + (v−1)·P, so a micro-batch goes round the ranks v times. Each task is one chunk (1/v of a rank's layers),
so the fill and drain of P − 1 ticks each cost 1/v as much:

    bubble fraction  (P − 1) / (v·M + P − 1)          (1F1B: (P − 1) / (M + P − 1), v = 1)
    rank r's order   Megatron's: warm-up of min(v·M, 2·(P − r − 1) + (v − 1)·P) forwards, then one forward,
                     one backward; forwards go chunk by chunk in groups of P micro-batches, backwards the
                     same with the chunks reversed (requires M a multiple of P)
    activations      rank 0 holds at most 2·(P − 1) + (v − 1)·P + 1 chunk-sized activations,
                     = P + (P − 1)/v stages' worth (1F1B: P): a little more memory for less bubble
    cost             v× the point-to-point messages of 1F1B
"""

from __future__ import annotations

from minidist.nn.checks import check_count

from .schedule import Schedule, place_in_ticks
from .tasks import Task


def interleaved_orders(num_ranks: int, num_micro_batches: int, num_chunks: int) -> list[list[Task]]:
    """Each rank's task order under Megatron's interleaved 1F1B (P ranks, M micro-batches, v chunks).

    The k-th forward of a rank runs chunk c = (k mod P·v) // P on micro-batch (k // P·v)·P + k mod P, i.e.
    stage c·P + r; the k-th backward the same with chunk v − 1 − c.
    """
    P, M, v = num_ranks, num_micro_batches, num_chunks
    # BEGIN SOLUTION interleaved_orders
    def task(r: int, kind: str, k: int) -> Task:
        chunk = (k % (P * v)) // P
        if kind == "B":
            chunk = v - 1 - chunk
        return Task(r, kind, (k // (P * v)) * P + k % P, chunk * P + r)

    orders = []
    for r in range(P):
        total = v * M
        warmup = min(total, 2 * (P - r - 1) + (v - 1) * P)
        order = [task(r, "F", k) for k in range(warmup)]
        for k in range(total - warmup):         # steady state: one forward, one backward
            order += [task(r, "F", warmup + k), task(r, "B", k)]
        order += [task(r, "B", k) for k in range(total - warmup, total)]   # drain
        orders.append(order)
    return orders
    # END SOLUTION


def interleaved_schedule(num_ranks: int, num_micro_batches: int, num_chunks: int) -> Schedule:
    """Interleaved 1F1B as ticks: P ranks, M micro-batches (a multiple of P), v chunks per rank."""
    check_count(num_ranks, "number of ranks P")
    check_count(num_micro_batches, "number of micro-batches M")
    check_count(num_chunks, "num_chunks")
    if num_micro_batches % num_ranks:
        raise ValueError(f"the interleaved schedule takes micro-batches in groups of P = {num_ranks}: "
                         f"M = {num_micro_batches} is not a multiple of it")
    orders = interleaved_orders(num_ranks, num_micro_batches, num_chunks)
    return place_in_ticks(orders, num_ranks * num_chunks)


def interleaved_bubble(num_ranks: int, num_micro_batches: int, num_chunks: int) -> float:
    """(P − 1) / (v·M + P − 1)."""
    P, M, v = num_ranks, num_micro_batches, num_chunks
    return (P - 1) / (v * M + P - 1)


def interleaved_in_flight(num_ranks: int, num_micro_batches: int, num_chunks: int) -> list[int]:
    """Per rank r, the most chunk activations held: min(v·M, 2·(P − r − 1) + (v − 1)·P + 1)."""
    P, M, v = num_ranks, num_micro_batches, num_chunks
    return [min(v * M, 2 * (P - r - 1) + (v - 1) * P + 1) for r in range(P)]
