"""What minidist's collectives, ring attention and Chimera's replica sum cost on the simulated clock, exactly.

The cluster's clock (minidist/cluster/ledger.py): a send costs the sender α + β·n and stamps the message
with the sender's clock after it; a receive ends at max(own clock, that stamp). A ``sendrecv`` sends, then
receives. So in a round where every rank r sends n_r bytes to some rank and receives from src(r), starting
from clocks c_r:

    c_r  <-  max(c_r + α + β·n_r,  c_src(r) + α + β·n_src(r))                                   (one round)

Walking the rounds of an algorithm with the pieces it really sends (np.array_split's, minidist.split) gives
the clock exactly, also when the element count does not divide by P (the closed form of
collectives/cost.py, 2(P − 1)(α + β·n/P), is exact only when it does):

    ring all-reduce      collectives/ring.py (``allreduce_gradients``): P − 1 rounds, rank r sends chunk
                         (r − s − 1) mod P to r + 1, then P − 1 rounds sending chunk (r − s) mod P
    pairwise all-reduce  collectives/primitives.py (``pairwise_allreduce``: tensor parallelism's f and g,
                         the context group's sum of the blocks' gradients): round k, rank r sends piece
                         r + k to rank r + k (reduce-scatter), then its own piece r to rank r + k (all-gather)
    ring attention       context/ring.py: c steps; step s moves K|V (and, in backward, dK|dV) one rank on,
                         beside the block's compute: the step takes max(transfers, FLOPs / rate); backward
                         ends with one more transfer (dK|dV home). The zigzag split gives every rank the
                         same unmasked pairs at every step, so the group stays in step
    Chimera's pairs      pipeline/tasks_executor.py: the two holders of a stage exchange each parameter's
                         gradient (one sendrecv per parameter); the first exchange waits for the later of
                         the two, then they move together: max(c_r, c_partner) + Σ_p (α + β·|p|)
"""

from __future__ import annotations

import numpy as np

from minidist.cluster import LinkModel
from minidist.parallel.context.blocks import causal_mask
from minidist.parallel.context.layout import positions
from minidist.split import split_sizes


def rounds_seconds(rounds: list[list[tuple[int, int]]], link: LinkModel) -> float:
    """Seconds until the last of P ranks (starting together) is done with ``rounds``: each round a list,
    per rank r, of (destination, bytes sent)."""
    clocks = np.zeros(len(rounds[0]) if rounds else 1)
    for sends in rounds:
        done = np.array([clocks[r] + link.alpha + link.beta * n for r, (_, n) in enumerate(sends)])
        clocks = done.copy()
        for r, (dst, _) in enumerate(sends):
            clocks[dst] = max(clocks[dst], done[r])
    return float(clocks.max())


def ring_allreduce_seconds(elements: int, parts: int, itemsize: int, link: LinkModel) -> float:
    """collectives/ring.py's all-reduce of ``elements`` over ``parts`` ranks (0 for one rank)."""
    p, sizes = parts, split_sizes(elements, parts)
    if p == 1 or elements == 0:
        return 0.0
    scatter = [[((r + 1) % p, itemsize * sizes[(r - s - 1) % p]) for r in range(p)] for s in range(p - 1)]
    gather = [[((r + 1) % p, itemsize * sizes[(r - s) % p]) for r in range(p)] for s in range(p - 1)]
    return rounds_seconds(scatter + gather, link)


def pairwise_allreduce_seconds(elements: int, parts: int, itemsize: int, link: LinkModel) -> float:
    """collectives.pairwise_allreduce (reduce_scatter + allgather) over ``parts`` ranks."""
    p, sizes = parts, split_sizes(elements, parts)
    if p == 1:
        return 0.0
    scatter = [[((r + k) % p, itemsize * sizes[(r + k) % p]) for r in range(p)] for k in range(1, p)]
    gather = [[((r + k) % p, itemsize * sizes[r]) for r in range(p)] for k in range(1, p)]
    return rounds_seconds(scatter + gather, link)


def ring_attention_seconds(micro_batch: int, seq: int, heads: int, d_head: int, parts: int, rate: float,
                           link: LinkModel, itemsize: int = 8) -> tuple[float, float]:
    """(forward, backward) seconds of RingAttention over ``parts`` ranks (zigzag, causal) for ``heads``
    heads on this rank, ``rate`` FLOP/s for its blocks. K|V is one (2, b, h, T/c, d_k) message."""
    c = parts
    mine = [positions(seq, c, r) for r in range(c)]
    kv = 2 * micro_batch * heads * len(mine[0]) * d_head * itemsize
    send = link.alpha + link.beta * kv
    forward = backward = 0.0
    for step in range(c):      # every rank's block has as many unmasked pairs (docstring): take the most
        pairs = max(int(np.count_nonzero(causal_mask(mine[r], mine[(r - step) % c]))) for r in range(c))
        per_pair = micro_batch * heads * d_head * pairs / rate
        forward += max(send if step < c - 1 else 0.0, 4 * per_pair)
        backward += max(((step < c - 1) + (step > 0)) * send, 10 * per_pair)
    return forward, backward + (send if c > 1 else 0.0)


def replica_sum_seconds(arrays: int, elements: int, itemsize: int, link: LinkModel) -> float:
    """Chimera's exchange of a stage pair's gradients (``arrays`` parameters of ``elements`` in all), one
    sendrecv per parameter, after the two holders meet: arrays·α + β·itemsize·elements."""
    return arrays * link.alpha + link.beta * itemsize * elements
