"""A two-level cluster: nodes of accelerators, a fast link inside a node, a slower network between nodes.

    topo = Topology(nodes=2, per_node=4, intra=LinkModel(5e-6, 1 / 150e9), inter=LinkModel(5e-6, 1 / 15e9))
    run(fn, 8, link=topo)            # comm.clock now charges each message by the link it crosses

Ranks fill the nodes in order, as MPI and NCCL number processes launched node by node: world rank r
lives on node r // per_node with local index r % per_node. A message of n bytes from rank a to rank b
costs

    intra.alpha + n · intra.beta                        a and b on the same node
    hops(a, b) · (inter.alpha + n · inter.beta)          different nodes

On a switched network (``network="switch"``, the default) every pair of nodes is one hop apart. With
``network="ring"`` the nodes sit on a ring and a message is forwarded hop by hop (store and forward)
over the ring distance between the nodes; within a node the accelerators also form a ring (NVLink
rings), so the whole cluster is a 2-D torus, the network of TPU pods. The clock models no contention:
a link costs the same however many messages share it.

Sources: the "Scaling Deep Learning" slides (hardware topology: interconnect comes in hierarchies; map
the processes to it); the Hot Chips tutorial "Scaling DL Training" (ring reduction, or toroidal with
four neighbours as TPUs do; topologies must match the communication pattern).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ledger import LinkModel

NETWORKS = ("switch", "ring")


@dataclass(frozen=True)
class Topology:
    """``nodes`` nodes of ``per_node`` ranks; ``intra``/``inter``: the LinkModel inside / between nodes.

    Defaults: inside a node the default LinkModel (one NVLink-2 link, 25 GB/s); between nodes
    InfiniBand EDR (alpha = 5 us, 12.5 GB/s).
    """

    nodes: int
    per_node: int
    intra: LinkModel = field(default_factory=LinkModel)
    inter: LinkModel = field(default_factory=lambda: LinkModel(alpha=5e-6, beta=1 / 12.5e9))
    network: str = "switch"

    def __post_init__(self):
        for name in ("nodes", "per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Topology expects {name} to be an int >= 1, got {value!r}")
        for name in ("intra", "inter"):
            if not isinstance(getattr(self, name), LinkModel):
                got = type(getattr(self, name)).__name__
                raise TypeError(f"Topology expects {name} to be a LinkModel, got {got}")
        if self.network not in NETWORKS:
            raise ValueError(f"Topology expects network in {NETWORKS}, got {self.network!r}")

    @property
    def size(self) -> int:
        """The number of ranks the cluster holds: nodes · per_node."""
        return self.nodes * self.per_node

    def check_covers(self, world_size: int) -> None:
        """Raise ValueError unless the cluster has a place for every rank (world_size <= nodes · per_node)."""
        if world_size > self.size:
            raise ValueError(f"the topology has {self.nodes} nodes × {self.per_node} ranks = {self.size} "
                             f"places, too few for world_size {world_size}")

    def node(self, rank: int) -> int:
        """The node of world rank ``rank``: rank // per_node."""
        return rank // self.per_node

    def local(self, rank: int) -> int:
        """The index of world rank ``rank`` inside its node: rank % per_node."""
        return rank % self.per_node

    def hops(self, a: int, b: int) -> int:
        """Inter-node links a message from world rank a to b crosses (0: the same node)."""
        d = abs(self.node(a) - self.node(b))
        return min(d, self.nodes - d) if self.network == "ring" else min(d, 1)

    def level(self, a: int, b: int) -> str:
        """"intra" if world ranks a and b share a node, else "inter"."""
        return "intra" if self.node(a) == self.node(b) else "inter"

    def message_time(self, a: int, b: int, nbytes: int) -> float:
        """Simulated seconds of one message of ``nbytes`` bytes from world rank a to world rank b."""
        hops = self.hops(a, b)
        if hops == 0:
            return self.intra.alpha + nbytes * self.intra.beta
        return hops * (self.inter.alpha + nbytes * self.inter.beta)


def topology_of(comm) -> Topology | None:
    """The Topology a communicator's run was given (``run(..., link=Topology(...))``), or None."""
    link = comm._ledger.link
    return link if isinstance(link, Topology) else None


def world_ranks(comm) -> list[int]:
    """The world ranks behind comm's ranks 0..world_size-1 (a communicator from ``split`` has a subset)."""
    return list(comm._ranks)


def groups_across_nodes(comm, group_of) -> dict:
    """{group: sorted nodes} of every group of comm's ranks (``group_of(rank)``) that spans more than one
    node of the run's Topology; {} when none does, or the run has no Topology."""
    topo = topology_of(comm)
    if topo is None:
        return {}
    nodes: dict = {}
    for rank, world in enumerate(world_ranks(comm)):
        nodes.setdefault(group_of(rank), set()).add(topo.node(world))
    return {group: sorted(found) for group, found in nodes.items() if len(found) > 1}
