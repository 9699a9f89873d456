"""What ring attention and Chimera's replica sum cost on the simulated clock, exactly.

The collectives the planner prices (ring and pairwise all-reduce, all-to-all) are priced by the one
walker of their rounds, minidist.sim.collective_cost (``collective_seconds``); these two exchanges are not
collectives of minidist.collectives, so their rounds are written here, with the same message cost
(LinkModel.time: α + β·n on the sender's clock) and, for the replica sum, the same walker:

    ring attention       context/ring.py: c steps; step s moves K|V (and, in backward, dK|dV) one rank on,
                         beside the block's compute: the step takes max(transfers, FLOPs / rate); backward
                         ends with one more transfer (dK|dV home). The zigzag split gives every rank the
                         same unmasked pairs at every step, so the group stays in step
    Chimera's pairs      pipeline/pipeline.py: the two holders of a stage exchange each parameter's
                         gradient (one sendrecv per parameter); the first exchange waits for the later of
                         the two, then they move together: max(c_r, c_partner) + Σ_p (α + β·|p|)
"""

from __future__ import annotations

import numpy as np

from minidist.cluster import LinkModel
from minidist.nn.blockwise_attention import causal_mask
from minidist.parallel.context.layout import positions
from minidist.sim.collective_cost import price
from minidist.sim.collective_rounds import Schedule, Transfer


def ring_attention_seconds(micro_batch: int, seq: int, heads: int, d_head: int, parts: int, rate: float,
                           link: LinkModel, itemsize: int = 8) -> tuple[float, float]:
    """(forward, backward) seconds of RingAttention over ``parts`` ranks (zigzag, causal) for ``heads``
    heads on this rank, ``rate`` FLOP/s for its blocks. K|V is one (2, b, h, T/c, d_k) message."""
    c = parts
    mine = [positions(seq, c, r) for r in range(c)]
    kv = 2 * micro_batch * heads * len(mine[0]) * d_head * itemsize
    send = link.time(kv)
    forward = backward = 0.0
    for step in range(c):      # every rank's block has as many unmasked pairs (docstring): take the most
        pairs = max(int(np.count_nonzero(causal_mask(mine[r], mine[(r - step) % c]))) for r in range(c))
        per_pair = micro_batch * heads * d_head * pairs / rate
        forward += max(send if step < c - 1 else 0.0, 4 * per_pair)
        backward += max(((step < c - 1) + (step > 0)) * send, 10 * per_pair)
    return forward, backward + (send if c > 1 else 0.0)


def replica_sum_seconds(arrays: int, elements: int, itemsize: int, link: LinkModel) -> float:
    """Chimera's exchange of a stage pair's gradients (``arrays`` parameters of ``elements`` in all), one
    sendrecv per parameter, after the two holders meet: arrays·α + β·itemsize·elements (only the number
    of parameters and their total size matter, so the walk cuts ``elements`` into ``arrays`` pieces)."""
    pairs = tuple((Transfer(0, 1, k, k + 1, True), Transfer(1, 0, k, k + 1, True)) for k in range(arrays))
    return price(Schedule("replica_sum", 2, arrays, pairs), elements, itemsize, link).time
