"""Topology-aware allreduce on a two-level cluster (``run(..., link=Topology(...))``).

N nodes of G ranks each, an array of n bytes. Inside a node the links are fast (α_i, β_i), between
nodes slow (α_e, β_e). A flat ring crosses the slow network at every one of its 2(P − 1) steps, so
T_ring = 2(P − 1)(α_e + n/P · β_e). The hierarchical allreduce (NCCL's "tree of rings" idea, and
Horovod's hierarchical allreduce) keeps the bulk of the traffic inside the nodes:

1. reduce-scatter inside each node: rank with local index g holds piece g of the node's sum;
2. allreduce across nodes among the N ranks with the same local index, on pieces of n/G bytes;
3. allgather inside each node.

    T_hier = 2(G − 1)(α_i + n/G · β_i) + T_inter(N, n/G)

With recursive doubling across nodes T_inter = log2 N · (α_e + n/G · β_e). The 2-D torus allreduce
("torus") runs every step as the two phases of a ring (collectives/ring.py) over the rows and the
columns: every message then goes to a neighbour, T_inter = 2(N − 1)(α_e + n/(G N) · β_e), the scheme of TPU
pods (Hot Chips tutorial "Scaling DL Training": "toroidal with four neighbors"). Costs: topology_cost.py.

Both need every node of the communicator to hold the same number of its ranks (ValueError otherwise).
The traffic of the node and cross-node groups is added to ``comm.stats``, so the counters of the
communicator still say what this allreduce sent.
"""

from __future__ import annotations

import weakref

import numpy as np

from minidist.cluster.topology import topology_of, world_ranks
from minidist.collectives.halving_doubling import recursive_doubling_allreduce
from minidist.collectives.primitives import allgather, reduce_scatter
from minidist.collectives.ring import ring_allgather, ring_chunk, ring_reduce_scatter
from minidist.collectives.topology_cost import flat_time, hierarchical_cost, torus_cost

_groups: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()     # comm -> (intra, inter), see node_groups


def node_layout(comm, algorithm: str = "hierarchical") -> tuple[int, int, int, int]:
    """(node index, local index, nodes N, ranks per node G) of this rank among comm's ranks.

    Nodes are numbered in the order they first appear in comm; local indices by comm rank. Raises
    ValueError without a Topology, or if comm's nodes do not hold equally many of its ranks.
    """
    topo = topology_of(comm)
    if topo is None:
        raise ValueError(f"allreduce algorithm {algorithm!r} needs a cluster topology: "
                         f"run(fn, P, link=Topology(nodes, per_node, ...))")
    nodes = [topo.node(w) for w in world_ranks(comm)]
    order = list(dict.fromkeys(nodes))
    counts = [nodes.count(node) for node in order]
    if len(set(counts)) != 1:
        raise ValueError(
            f"allreduce algorithm {algorithm!r} needs nodes of equal size, but this communicator "
            f"has {dict(zip(order, counts))} ranks on nodes {order}"
        )
    mine = nodes[comm.rank]
    return order.index(mine), nodes[:comm.rank].count(mine), len(order), counts[0]


def node_groups(comm, algorithm: str = "hierarchical"):
    """(intra, inter): the communicator of this rank's node, and that of the ranks of all nodes with
    this rank's local index. Built once per communicator with ``comm.split`` (collective), then reused."""
    if comm not in _groups:
        node, local, _, _ = node_layout(comm, algorithm)
        intra = comm.split(color=node, key=comm.rank)
        inter = comm.split(color=local, key=comm.rank)
        _groups[comm] = (intra, inter)
    return _groups[comm]


def hierarchical_allreduce(comm, flat: np.ndarray, op: str = "sum") -> np.ndarray:
    """Allreduce the 1-D array ``flat`` (n elements, overwritten) in three levels; returns it.

    op: "sum", "max" or "min". Inside a node: ``reduce_scatter`` and ``allgather`` (rings, on
    ``intra``); across nodes: recursive doubling on ``inter``. Every rank ends with bitwise the same array.
    """
    intra, inter = node_groups(comm, "hierarchical")
    before = _sent(intra, inter)
    # BEGIN SOLUTION hierarchical_allreduce
    # BEGIN PROMPT
    # Hint: three steps. reduce_scatter(intra, flat, op) leaves this rank's piece of its node's sum;
    # recursive_doubling_allreduce(inter, piece, op) sums that piece over the nodes (all ranks with
    # this local index); allgather(intra, piece) brings every piece back: concatenate them into flat.
    # END PROMPT
    piece = reduce_scatter(intra, flat, op=op)              # 1. piece g of this node's sum
    piece = recursive_doubling_allreduce(inter, piece, op)  # 2. piece g of the total, on every node
    flat[...] = np.concatenate(allgather(intra, piece))     # 3. all pieces, in local-index order
    # END SOLUTION
    _count(comm, intra, inter, before)
    return flat


def torus_allreduce(comm, flat: np.ndarray, op: str = "sum") -> np.ndarray:
    """Allreduce the 1-D array ``flat`` (overwritten) on a 2-D torus: rings inside the nodes (rows) and
    rings across the nodes (columns); every message goes to a neighbour. Returns it."""
    intra, inter = node_groups(comm, "torus")
    before = _sent(intra, inter)
    ring_reduce_scatter(intra, flat, op)                     # row ring: piece g of this node's sum
    piece = ring_chunk(flat, intra.world_size, intra.rank)
    ring_reduce_scatter(inter, piece, op)                    # column ring: part k of piece g of the total
    ring_allgather(inter, piece)                             # column ring: piece g of the total
    ring_allgather(intra, flat)                              # row ring: everything
    _count(comm, intra, inter, before)
    return flat


TOPOLOGY_ALGORITHMS = {"hierarchical": hierarchical_allreduce, "torus": torus_allreduce}


def choose_by_topology(comm, nbytes: int) -> str | None:
    """``auto`` on a cluster with a Topology: "hierarchical" or "torus" when its predicted time beats the
    flat ring's and recursive doubling's on this topology (topology_cost.py), else None (then the
    classic rule applies). None too without a Topology, on one node, or with unequal nodes."""
    topo = topology_of(comm)
    if topo is None or comm.world_size == 1:
        return None
    try:
        _, _, nodes, per_node = node_layout(comm)
    except ValueError:
        return None
    if nodes == 1 or per_node == 1 or world_ranks(comm) != list(range(comm.world_size)):
        return None
    times = {"hierarchical": hierarchical_cost(topo, nbytes).time, "torus": torus_cost(topo, nbytes).time,
             "ring": flat_time("ring", topo, comm.world_size, nbytes),
             "recursive_doubling": flat_time("recursive_doubling", topo, comm.world_size, nbytes)}
    best = min(times, key=times.get)
    return best if best in TOPOLOGY_ALGORITHMS else None


def _sent(*comms) -> list[tuple[int, int, int, int]]:
    return [(c.stats.bytes_sent, c.stats.bytes_received, c.stats.messages_sent, c.stats.messages_received)
            for c in comms]


def _count(comm, intra, inter, before) -> None:
    """Add the node groups' traffic of this call to comm.stats (payload only, as everywhere)."""
    for now, then in zip(_sent(intra, inter), before):
        comm.stats.bytes_sent += now[0] - then[0]
        comm.stats.bytes_received += now[1] - then[1]
        comm.stats.messages_sent += now[2] - then[2]
        comm.stats.messages_received += now[3] - then[3]
