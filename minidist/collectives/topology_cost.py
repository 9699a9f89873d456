"""Closed-form α-β costs of allreduce on a two-level cluster (a ``Topology``: N nodes × G ranks).

Per rank, for an array of n bytes (intra link α_i, β_i; inter link α_e, β_e; h(d) the inter-node hops
between nodes d apart: 1 on a switch, min(d, N − d) on a ring of nodes):

    algorithm      intra messages   inter messages   time
    hierarchical   2(G − 1) of n/G  log2 N of n/G    2(G − 1)(α_i + n/G β_i) + Σ_k h(2^k)(α_e + n/G β_e)
    torus          2(G − 1) of n/G  2(N − 1) of n/GN 2(G − 1)(α_i + n/G β_i) + 2(N − 1)(α_e + n/(GN) β_e)
    flat ring      (a ring over all P = NG ranks)      2(P − 1) · max over ring links of t(n/P)

(k = 0 .. log2 N − 1: recursive doubling pairs nodes 2^k apart.) The flat ring is paced by its slowest
link: at every step the rank behind a slow link waits for it, so on two levels T = 2(P − 1)(α_e + n/P β_e).
Exact when N is a power of two (hierarchical) and the element count divides by G (hierarchical), by
G·N (torus) and by P (ring): then every rank of a level moves in lockstep and the cluster's clock equals
these formulas; otherwise they are the textbook's approximation. Source: the "Hardware Accelerators for
Training DNNs" tutorial (collectives, α-β model) and the "Scaling Deep Learning" slides (topology).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LevelCost:
    """Closed-form per-rank cost by level: messages and bytes sent inside / between nodes, and the time."""

    algorithm: str
    intra_messages: int
    intra_bytes: float
    inter_messages: int
    inter_bytes: float
    time: float

    @property
    def messages(self) -> int:
        """Messages sent per rank, both levels."""
        return self.intra_messages + self.inter_messages

    @property
    def bytes(self) -> float:
        """Payload bytes sent per rank, both levels."""
        return self.intra_bytes + self.inter_bytes


def _check(topology, nbytes: int) -> None:
    if not hasattr(topology, "message_time"):
        raise TypeError(f"expected a minidist.cluster Topology, got {type(topology).__name__}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")


def _node_hops(topology, distance: int) -> int:
    """Inter-node hops between two nodes ``distance`` apart."""
    n = topology.nodes
    return min(distance, n - distance) if topology.network == "ring" else 1


def hierarchical_cost(topology, nbytes: int) -> LevelCost:
    """Reduce-scatter in the node, recursive doubling across nodes, allgather in the node (n = nbytes)."""
    _check(topology, nbytes)
    g, nodes, intra, inter = topology.per_node, topology.nodes, topology.intra, topology.inter
    piece = nbytes / g
    steps = (nodes - 1).bit_length()           # log2 N (⌈log2 N⌉ when N is not a power of two)
    time = 2 * (g - 1) * (intra.alpha + piece * intra.beta)
    time += sum(_node_hops(topology, 1 << k) for k in range(steps)) * (inter.alpha + piece * inter.beta)
    return LevelCost("hierarchical", 2 * (g - 1), 2 * (g - 1) * piece, steps, steps * piece, time)


def torus_cost(topology, nbytes: int) -> LevelCost:
    """Rings in the node (rows) and rings across the nodes (columns), every message to a neighbour."""
    _check(topology, nbytes)
    g, nodes, intra, inter = topology.per_node, topology.nodes, topology.intra, topology.inter
    piece, part = nbytes / g, nbytes / (g * nodes)
    time = 2 * (g - 1) * (intra.alpha + piece * intra.beta) + 2 * (nodes - 1) * (
        inter.alpha + part * inter.beta
    )
    return LevelCost("torus", 2 * (g - 1), 2 * (g - 1) * piece, 2 * (nodes - 1), 2 * (nodes - 1) * part, time)


def flat_time(algorithm: str, topology, world_size: int, nbytes: int) -> float:
    """Time of a flat "ring" or "recursive_doubling" allreduce over world ranks 0..world_size-1.

    ring: 2(P − 1) · the slowest ring link's time for n/P bytes (exact for n divisible by P).
    recursive_doubling: Σ_k the slowest pair's time for n bytes at distance 2^k (exact for P a power of
    two; otherwise an estimate that leaves out the fold steps).
    """
    _check(topology, nbytes)
    topology.check_covers(world_size)
    p = world_size
    if p == 1:
        return 0.0
    if algorithm == "ring":
        slowest = max(topology.message_time(r, (r + 1) % p, nbytes / p) for r in range(p))
        return 2 * (p - 1) * slowest
    if algorithm == "recursive_doubling":
        steps = (p - 1).bit_length()
        return sum(max(topology.message_time(r, r ^ (1 << k), nbytes) for r in range(p) if r ^ (1 << k) < p)
                   for k in range(steps))
    raise ValueError(f"flat_time knows 'ring' and 'recursive_doubling', got {algorithm!r}")


def hierarchical_speedup(topology, nbytes: int) -> float:
    """T_flat ring / T_hierarchical on the whole topology: the factor the lesson checks."""
    return flat_time("ring", topology, topology.size, nbytes) / hierarchical_cost(topology, nbytes).time
