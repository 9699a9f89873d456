"""What ring attention moves and how long a step takes, in closed form.

Per rank r of c, with n_j = B·h·T_j·d_k·itemsize the bytes of rank j's K (or V) (T_j its token count):

    forward   sends the blocks of ranks r, r−1, …, r−c+2 (K and V):      c − 1 messages, 2·Σ n_j
    backward  the same K, V blocks, plus dK, dV of every block once:   2c − 1 messages, 2·Σ n_j + 2·Σ_all n_j

Time of one forward on the α-β link, a device of R FLOP/s, F(s) the FLOPs of a block at step s:

    overlapped    Σ_s max(F(s)/R, α + β·2n)    (the ring moves in lock step, so with the causal mask
    sequential    Σ_s (F(s)/R + α + β·2n)       the busiest rank sets the pace; step_seconds: both passes)

Against tensor parallelism of attention (Megatron: 2 all-reduces of B·T·d words per layer forward and
backward, each 2(t−1)/t of its bytes per rank), ring attention sends K and V, 2·B·T·d·(c−1)/c words per
forward — the same order — but hides them behind O(T²) attention compute, which grows faster than the
O(T) transfer: past some T the transfer is free. ``crossover_seq_len`` finds that T.
"""

from __future__ import annotations

from minidist.cluster import Device, LinkModel

from .layout import positions


def ring_traffic(seq_len: int, parts: int, rank: int, batch: int, heads: int, d_k: int, itemsize: int,
                 layout: str = "zigzag") -> dict[str, int]:
    """Bytes and messages rank sends in one forward and one backward (= what it receives, by symmetry of
    the ring up to block sizes): forward_bytes, forward_messages, backward_bytes, backward_messages."""
    if parts == 1:
        return {"forward_bytes": 0, "forward_messages": 0, "backward_bytes": 0, "backward_messages": 0}
    block = [batch * heads * d_k * itemsize * len(positions(seq_len, parts, j, layout)) for j in range(parts)]
    passed = sum(block[(rank - s) % parts] for s in range(parts - 1))
    return {"forward_bytes": 2 * passed, "forward_messages": parts - 1,
            "backward_bytes": 2 * passed + 2 * sum(block), "backward_messages": 2 * parts - 1}


def causal_work(seq_len: int, parts: int, layout: str) -> list[int]:
    """Unmasked query–key pairs per rank under the causal mask: Σ over its positions p of (p + 1) (the
    forward's FLOPs are 4·B·h·d_k times)."""
    return [int((positions(seq_len, parts, r, layout) + 1).sum()) for r in range(parts)]


def step_seconds(seq_len: int, parts: int, batch: int, heads: int, d_k: int, itemsize: int,
                 overlap: bool = True, link: LinkModel | None = None,
                 device: Device | None = None) -> tuple[float, float]:
    """Simulated (forward, backward) seconds of non-causal ring attention when c divides T, as ring.py
    charges them. With x = α + β·2n (one K/V or dK/dV message), F = 4·B·h·d_k·(T/c)²/R, F_b = 2.5·F:

        forward    (c−1)·max(x, F) + F                                  (overlap=False: c·F + (c−1)·x)
        backward   2·max(x, F_b) + (c−2)·max(2x, F_b) + x                (overlap=False: c·F_b + (2c−1)·x)

    (backward: the first step sends K, V; the middle ones K, V and the previous block's dK, dV; the last
    dK, dV; then the finished dK, dV go home.) c = 1: (F, F_b).
    """
    if seq_len % parts:
        raise ValueError(f"step_seconds assumes c divides T, got T={seq_len}, c={parts}")
    link, device = link or LinkModel(), device or Device()
    tokens = seq_len // parts
    f = 4 * batch * heads * d_k * tokens * tokens / device.flops
    f_b = 2.5 * f
    x = link.alpha + link.beta * 2 * batch * heads * tokens * d_k * itemsize
    if parts == 1:
        return f, f_b
    if not overlap:
        return parts * f + (parts - 1) * x, parts * f_b + (2 * parts - 1) * x
    forward = (parts - 1) * max(x, f) + f
    backward = 2 * max(x, f_b) + (parts - 2) * max(2 * x, f_b) + x
    return forward, backward


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
