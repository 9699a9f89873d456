"""What ring attention moves and how long a step takes, in closed form.

Per rank r of c, with n_j = B·h·T_j·d_k·itemsize the bytes of rank j's K (or V) (T_j its token count):

    forward   sends the blocks of ranks r, r−1, …, r−c+2 (K and V):      c − 1 messages, 2·Σ n_j
    backward  the same K, V blocks, plus dK, dV of every block once:   2c − 1 messages, 2·Σ n_j + 2·Σ_all n_j

When c divides T every n_j = n and these are 2(c−1)·n and (4c−2)·n (ring.py's docstring).

Time of one forward on the α-β link, a device of R FLOP/s, F_r(s) the FLOPs of rank r's block at step s:

    overlapped    Σ_s max(F(s)/R, α + β·2n)    (every rank waits for the slowest neighbour: the ring
    sequential    Σ_s (F(s)/R + α + β·2n)       moves in lock step, so the busiest rank sets the pace)

Against tensor parallelism of attention (Megatron: 2 all-reduces of B·T·d words per layer forward and
backward, each 2(t−1)/t of its bytes per rank), ring attention sends K and V, 2·B·T·d·(c−1)/c words per
forward — the same order — but hides them behind O(T²) attention compute, which grows faster than the
O(T) transfer: past some T the transfer is free. ``crossover_seq_len`` finds that T.
"""

from __future__ import annotations

from minidist.cluster import Device, LinkModel

from .layout import causal_pairs, positions


def ring_traffic(seq_len: int, parts: int, rank: int, batch: int, heads: int, d_k: int, itemsize: int,
                 layout: str = "zigzag") -> dict[str, int]:
    """Bytes and messages rank sends in one forward and one backward (= what it receives, by symmetry
    of the ring up to block sizes). Keys: forward_bytes, forward_messages, backward_bytes, backward_messages."""
    if parts == 1:
        return {"forward_bytes": 0, "forward_messages": 0, "backward_bytes": 0, "backward_messages": 0}
    block = [batch * heads * d_k * itemsize * len(positions(seq_len, parts, j, layout)) for j in range(parts)]
    passed = sum(block[(rank - s) % parts] for s in range(parts - 1))
    return {"forward_bytes": 2 * passed, "forward_messages": parts - 1,
            "backward_bytes": 2 * passed + 2 * sum(block), "backward_messages": 2 * parts - 1}


def causal_work(seq_len: int, parts: int, layout: str) -> list[int]:
    """Unmasked query–key pairs per rank under the causal mask (the forward's FLOPs are 4·B·h·d_k times)."""
    return [causal_pairs(seq_len, parts, r, layout) for r in range(parts)]


def forward_seconds(seq_len: int, parts: int, batch: int, heads: int, d_k: int, itemsize: int,
                    causal: bool = False, overlap: bool = True, link: LinkModel | None = None,
                    device: Device | None = None) -> float:
    """Simulated forward time of non-causal ring attention when c divides T (every step alike):
    c·max(F/R, α + β·2n) overlapped, c·F/R + (c−1)(α + β·2n) sequential; F = 4·B·h·d_k·(T/c)²."""
    if causal:
        raise ValueError("forward_seconds has the closed form for causal=False only; the causal ring's time "
                         "depends on the split's per-step work (measure it on the clock)")
    if seq_len % parts:
        raise ValueError(f"forward_seconds assumes c divides T, got T={seq_len}, c={parts}")
    link, device = link or LinkModel(), device or Device()
    tokens = seq_len // parts
    compute = 4 * batch * heads * d_k * tokens * tokens / device.flops
    transfer = link.alpha + link.beta * 2 * batch * heads * tokens * d_k * itemsize
    if parts == 1:
        return compute
    if overlap:
        return (parts - 1) * max(compute, transfer) + compute
    return parts * compute + (parts - 1) * transfer


def crossover_seq_len(parts: int, batch: int, heads: int, d_k: int, itemsize: int,
                      link: LinkModel | None = None, device: Device | None = None) -> int:
    """The smallest T (a multiple of c) at which a step's compute F/R covers its transfer α + β·2n:
    from there on ring attention's communication is hidden completely."""
    if parts < 2:
        raise ValueError(f"crossover_seq_len needs c >= 2 ranks, got {parts}")
    link, device = link or LinkModel(), device or Device()
    tokens = 1
    while True:
        compute = 4 * batch * heads * d_k * tokens * tokens / device.flops
        if compute >= link.alpha + link.beta * 2 * batch * heads * tokens * d_k * itemsize:
            return tokens * parts
        tokens += 1
