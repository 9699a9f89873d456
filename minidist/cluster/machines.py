"""Real machines as Topology presets: the DGX-1's hybrid cube-mesh, a k-ary fat tree, a PCIe-only node.

    run(fn, 8, link=dgx1())                  # a message costs the link between the two GPUs
    run(fn, 16, link=fat_tree(4))            # k = 4: 16 hosts, 4 pods of 2 edge switches

Bandwidths, per direction, as the sources state them (latencies are not stated there: every preset
takes the cluster's default α = 5 us per link crossed, or the ``alpha`` given):

- NVLink 1 (Tesla P100): 20 GB/s per link, 4 links per GPU — the "160GB/s NV Link" of the Pascal GP100
  slide (Catanzaro, "Scaling Deep Learning": 4 links × 20 GB/s × 2 directions), "5-12X PCIe bandwidth".
- PCIe 3.0 x16: 8 GT/s per lane, 128b/130b coding: 16 · 8e9 · 128/130 / 8 ≈ 15.75 GB/s (PCI-SIG).
- DGX-1 (NVIDIA, "DGX-1 System Architecture" white paper, 2017; the "Hardware Accelerators" tutorial:
  "Blocking internal interconnect (Hyper cube mesh)", "bottleneck over PCIe"): 8 GPUs, two quads 0-3 and
  4-7 each fully connected by NVLink, and GPU i linked to i + 4 — NVLink exactly where i XOR j is 1, 2, 3
  or 4. The other 12 pairs of GPUs have no NVLink: their traffic goes GPU → PCIe switch → CPU → QPI → CPU →
  PCIe switch → GPU, at best the PCIe 3.0 x16 rate.
- k-ary fat tree (Al-Fares, Loukissas, Vahdat, "A scalable, commodity data center network architecture",
  SIGCOMM 2008): k-port switches, k pods of k/2 edge and k/2 aggregation switches, (k/2)² core switches,
  k³/4 hosts, every link 1 Gigabit Ethernet (125 MB/s) and full bisection bandwidth. Hosts under one edge
  switch are 2 links apart, in one pod 4, in different pods 6.
- PCIe-only node: 8 GPUs, every pair through PCIe 3.0 x16.

``order``: the GPU of each rank (a permutation of range(8)); placing a ring on NVLink is lesson 15's point.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ledger import LinkModel
from .topology import Topology

NVLINK1 = LinkModel(alpha=5e-6, beta=1 / 20e9)          # one NVLink 1 link, one direction
PCIE3_X16 = LinkModel(alpha=5e-6, beta=130 / (16 * 8e9 * 128 / 8))   # PCIe 3.0 x16, one direction
GIGABIT_ETHERNET = LinkModel(alpha=5e-6, beta=1 / 125e6)


@dataclass(frozen=True)
class LinkTable(Topology):
    """A Topology whose every pair of ranks (a, b) has its own link: ``links[a][b]`` (a LinkModel; None on
    the diagonal) of the kind ``kinds[a][b]`` ("nvlink", "pcie", "edge", ...). nodes/per_node/intra/inter
    stay those of a Topology (spans still say "intra"/"inter"); only the price of a message changes."""

    links: tuple = ()
    kinds: tuple = ()
    name: str = ""

    def __post_init__(self):
        super().__post_init__()
        if len(self.links) != self.size or any(len(row) != self.size for row in self.links):
            raise ValueError(f"LinkTable expects links to be {self.size} × {self.size} (nodes · per_node), "
                             f"got {len(self.links)} rows")

    def message_time(self, a: int, b: int, nbytes: int) -> float:
        """Seconds of one message of nbytes bytes from rank a to rank b: links[a][b].time(nbytes)."""
        return self.links[a][b].time(nbytes)

    def link_kind(self, a: int, b: int) -> str:
        """The kind of link between ranks a and b ("" for a == b)."""
        return self.kinds[a][b]


def _table(name: str, kind_of, link_of, size: int, nodes: int, per_node: int, intra: LinkModel,
           inter: LinkModel) -> LinkTable:
    kinds = tuple(tuple("" if a == b else kind_of(a, b) for b in range(size)) for a in range(size))
    links = tuple(tuple(None if a == b else link_of(kinds[a][b]) for b in range(size)) for a in range(size))
    return LinkTable(nodes, per_node, intra, inter, links=links, kinds=kinds, name=name)


def _check_order(order, size: int) -> tuple[int, ...]:
    if order is None:
        return tuple(range(size))
    gpus = list(order) if isinstance(order, (list, tuple)) else []
    if sorted(gpus) != list(range(size)) or any(isinstance(g, bool) or not isinstance(g, int) for g in gpus):
        raise ValueError(f"order must be a permutation of range({size}) (the GPU of each rank), "
                         f"got {order!r}")
    return tuple(gpus)


def dgx1(order=None, alpha: float = 5e-6) -> LinkTable:
    """The DGX-1 (P100) hybrid cube-mesh: NVLink 1 where GPU i XOR GPU j is 1..4, PCIe 3.0 x16 elsewhere.
    order: the GPU of each of the 8 ranks (default rank r on GPU r)."""
    gpu = _check_order(order, 8)
    nvlink, pcie = LinkModel(alpha, NVLINK1.beta), LinkModel(alpha, PCIE3_X16.beta)
    return _table("DGX-1 hybrid cube-mesh", lambda a, b: "nvlink" if 1 <= gpu[a] ^ gpu[b] <= 4 else "pcie",
                  {"nvlink": nvlink, "pcie": pcie}.get, 8, 1, 8, nvlink, pcie)


def pcie_node(gpus: int = 8, alpha: float = 5e-6) -> LinkTable:
    """One node of ``gpus`` GPUs with no NVLink: every pair through PCIe 3.0 x16."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"pcie_node expects gpus to be an int >= 1, got {gpus!r}")
    pcie = LinkModel(alpha, PCIE3_X16.beta)
    return _table("PCIe-only node", lambda a, b: "pcie", lambda kind: pcie, gpus, 1, gpus, pcie, pcie)


def fat_tree_links(k: int, a: int, b: int) -> int:
    """Links between hosts a and b of a k-ary fat tree: 2 (same edge switch), 4 (same pod), 6 (else)."""
    per_edge, per_pod = k // 2, k * k // 4
    if a // per_edge == b // per_edge:
        return 2
    return 4 if a // per_pod == b // per_pod else 6


def fat_tree(k: int = 4, alpha: float = 5e-6) -> LinkTable:
    """Al-Fares et al.'s k-ary fat tree of k³/4 hosts (one rank each) on 1 Gigabit Ethernet, k even >= 2.
    A message crossing L links costs L·α + n·β (full bisection: no link is shared, the bandwidth is one
    link's); each pod is a node of k²/4 hosts."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 2 or k % 2:
        raise ValueError(f"fat_tree expects k to be an even int >= 2 (ports per switch), got {k!r}")
    beta = GIGABIT_ETHERNET.beta
    links = {hops: LinkModel(hops * alpha, beta) for hops in (2, 4, 6)}
    per_pod = k * k // 4
    return _table(f"{k}-ary fat tree", lambda a, b: {2: "edge", 4: "pod", 6: "core"}[fat_tree_links(k, a, b)],
                  {"edge": links[2], "pod": links[4], "core": links[6]}.get, k * per_pod, k, per_pod,
                  links[4], links[6])
