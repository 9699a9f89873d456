"""Cost model of expert parallelism: the bytes of the all-to-alls and the time of the slowest expert.

Per MoE layer and step, a rank that routes n_out kept assignments to experts on other ranks and receives
n_in from other ranks sends, with d the model width and b bytes per element,
    forward:   n_out·d·b (dispatch) + n_in·d·b (combine)        backward: the same again
    total:     2·(n_out + n_in)·d·b                            (+ (e−1)·E/e·8 bytes of counts forward)
With uniform routing, top-k and n tokens per rank, n_out ≈ n_in ≈ k·n·(e−1)/e: the all-to-all volume
per rank grows with k and approaches 4·k·n·d·b as e grows — unlike the all-reduce of data parallelism it
does not depend on the size of the experts.

The experts' compute: 4·d·d_ff FLOPs per token forward (two products), 8 backward. The step waits for
the busiest rank, so with loads L_q (token rows held by rank q): t_experts = 12·d·d_ff · max_q L_q / F.
"""

from __future__ import annotations


def alltoall_bytes_sent(n_out: int, n_in: int, d: int, itemsize: int) -> int:
    """Token bytes one rank sends per layer and step (two all-to-alls forward, two backward)."""
    return 2 * (n_out + n_in) * d * itemsize


def counts_bytes_sent(world_size: int, experts_per_rank: int) -> int:
    """The counts all-to-all of forward: one int64 per expert of each other rank."""
    return (world_size - 1) * experts_per_rank * 8


def uniform_alltoall_bytes(tokens_per_rank: int, k: int, world_size: int, d: int, itemsize: int) -> float:
    """Expected token bytes per rank per layer and step if the router spreads tokens evenly
    (n_out = n_in = k·n·(e−1)/e, nothing dropped)."""
    off = k * tokens_per_rank * (world_size - 1) / world_size
    return 2 * (off + off) * d * itemsize


def expert_step_seconds(loads: list[int], d: int, d_ff: int, flops_per_second: float) -> float:
    """Forward + backward time of the experts when rank q processes loads[q] token rows:
    the slowest sets it."""
    return 12 * d * d_ff * max(loads) / flops_per_second


def imbalance(loads) -> float:
    """max load / mean load: 1 when balanced, E when every token goes to one of E experts."""
    loads = list(loads)
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else 1.0
