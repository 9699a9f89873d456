"""The machine presets: each link's bandwidth is its source's, the DGX-1's NVLink graph is the hybrid
cube-mesh, the fat tree's distances are Al-Fares et al.'s, and the clock charges a message by its link."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.cluster import Topology, run
from minidist.cluster.machines import (
    GIGABIT_ETHERNET,
    NVLINK1,
    PCIE3_X16,
    LinkTable,
    dgx1,
    fat_tree,
    fat_tree_links,
    pcie_node,
)


def test_bandwidths_are_the_sources():
    assert 1 / NVLINK1.beta == pytest.approx(20e9)           # NVLink 1: 20 GB/s per link and direction
    assert 4 * 2 / NVLINK1.beta == pytest.approx(160e9)      # the GP100 slide's "160GB/s NV Link"
    assert 1 / PCIE3_X16.beta == pytest.approx(16 * 8e9 * 128 / 130 / 8)   # 15.75 GB/s
    assert 1 / GIGABIT_ETHERNET.beta == pytest.approx(125e6)                # 1 Gb/s
    assert 5 <= 160e9 * PCIE3_X16.beta <= 12                 # "5-12X PCIe bandwidth": 10.2x


def test_dgx1_is_the_hybrid_cube_mesh():
    topo = dgx1()
    assert isinstance(topo, Topology) and topo.size == 8
    nvlink = {(a, b) for a in range(8) for b in range(8) if topo.link_kind(a, b) == "nvlink"}
    quads = {(a, b) for a in range(8) for b in range(8) if a != b and a // 4 == b // 4}
    assert nvlink == quads | {(a, (a + 4) % 8) for a in range(8)}       # two K4 quads and i -- i + 4
    assert all(sum(topo.link_kind(a, b) == "nvlink" for b in range(8)) == 4 for a in range(8))  # 4 links
    assert sum(topo.link_kind(a, b) == "pcie" for a in range(8) for b in range(8)) == 2 * 12
    assert topo.message_time(0, 1, 10**6) == pytest.approx(5e-6 + 10**6 / 20e9)
    assert topo.message_time(3, 4, 10**6) == pytest.approx(5e-6 + 10**6 * PCIE3_X16.beta)


def test_dgx1_order_places_ranks_on_gpus():
    ring = dgx1(order=[0, 1, 2, 3, 7, 6, 5, 4])
    assert all(ring.link_kind(r, (r + 1) % 8) == "nvlink" for r in range(8))   # this ring avoids PCIe
    assert [dgx1().link_kind(r, (r + 1) % 8) for r in (3, 7)] == ["pcie", "pcie"]
    for bad in ([0, 1, 2], [0] * 8, "01234567", [0, 1, 2, 3, 4, 5, 6, 7.0]):
        with pytest.raises(ValueError, match="order"):
            dgx1(order=bad)


@given(half=st.integers(1, 5))
def test_fat_tree_has_k_cubed_over_4_hosts_2_4_6_links_apart(half):
    k = 2 * half
    topo = fat_tree(k)
    assert topo.size == k ** 3 // 4 and topo.nodes == k and topo.per_node == k * k // 4
    count = {2: 0, 4: 0, 6: 0}
    for b in range(1, topo.size):
        count[fat_tree_links(k, 0, b)] += 1
    assert count == {2: k // 2 - 1, 4: k * k // 4 - k // 2, 6: topo.size - k * k // 4}
    far = topo.size - 1 if k > 2 else 1
    hops = fat_tree_links(k, 0, far)
    assert topo.message_time(0, far, 1000) == pytest.approx(hops * 5e-6 + 1000 / 125e6)


def test_pcie_node_and_bad_arguments():
    topo = pcie_node(4)
    assert {topo.link_kind(a, b) for a in range(4) for b in range(4) if a != b} == {"pcie"}
    for call, bad in ((fat_tree, 3), (fat_tree, 0), (pcie_node, 0), (pcie_node, True)):
        with pytest.raises(ValueError, match="k|gpus"):
            call(bad)
    with pytest.raises(ValueError, match="links"):
        LinkTable(1, 2, links=((None,),))


def _one_message(comm, nbytes):
    if comm.rank == 0:
        comm.send(np.zeros(nbytes, np.uint8), dst=comm.world_size - 1)
    elif comm.rank == comm.world_size - 1:
        comm.recv(0)
    return comm.clock


def test_the_clock_charges_the_link_crossed():
    for topo in (dgx1(), pcie_node(), fat_tree(4)):
        last = topo.size - 1
        clocks = run(_one_message, topo.size, 4096, link=topo)
        assert clocks[last] == pytest.approx(topo.message_time(0, last, 4096)), topo.name
