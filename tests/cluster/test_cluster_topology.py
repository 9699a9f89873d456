"""A Topology in the clock: each message is charged by the link it crosses, and traces show the level."""

import numpy as np
import pytest

from minidist.cluster import LinkModel, Topology, run, run_traced

# Powers of two: the times below are exact in floating point.
INTRA, INTER = LinkModel(2.0**-20, 2.0**-30), LinkModel(2.0**-16, 2.0**-26)


def ping_everyone(comm):
    """Rank 0 sends 1 KiB to every other rank in turn; each returns its clock."""
    if comm.rank == 0:
        for dst in range(1, comm.world_size):
            comm.send(np.zeros(1024, np.uint8), dst)
    else:
        comm.recv(0)
    return comm.clock


@pytest.mark.parametrize("network", ["switch", "ring"])
def test_each_message_costs_the_link_it_crosses(network):
    topo = Topology(4, 2, intra=INTRA, inter=INTER, network=network)
    clocks, trace = run_traced(ping_everyone, 8, link=topo)
    hops = {1: 0, 2: 1, 3: 1, 4: 2 if network == "ring" else 1, 5: 2 if network == "ring" else 1, 6: 1, 7: 1}
    times = [INTRA.time(1024) if hops[d] == 0 else hops[d] * INTER.time(1024) for d in range(1, 8)]
    assert clocks[0] == sum(times)
    assert clocks[1:] == list(np.cumsum(times))
    sends = trace.rank_spans(0)
    assert [s.level for s in sends] == ["intra"] + ["inter"] * 6
    assert sends[0].label == "send 1.0 KiB to 1 (intra)" and sends[1].label.endswith("(inter)")
    assert trace.rank_spans(1)[0].level == "intra" and trace.rank_spans(4)[0].level == "inter"
    assert trace.chrome_events()[-1]["args"]["level"] == "inter"


def test_node_and_local_index_follow_rank_order():
    topo = Topology(3, 4)
    assert [topo.node(r) for r in range(12)] == [r // 4 for r in range(12)]
    assert [topo.local(r) for r in range(12)] == [r % 4 for r in range(12)]
    assert topo.level(0, 3) == "intra" and topo.level(3, 4) == "inter"
    assert Topology(5, 1, network="ring").hops(0, 3) == 2 and Topology(5, 1).hops(0, 3) == 1


def test_plain_link_model_is_unchanged():
    link = LinkModel(2.0**-20, 2.0**-30)
    clocks, trace = run_traced(ping_everyone, 3, link=link)
    assert clocks[0] == 2 * link.time(1024)
    assert all(s.level == "" for s in trace.spans)
    assert trace.spans[0].label == "send 1.0 KiB to 1"


def test_a_topology_too_small_for_the_world_is_refused_before_starting():
    with pytest.raises(ValueError, match="too few for world_size 5"):
        run(ping_everyone, 5, link=Topology(2, 2))
    run(ping_everyone, 3, link=Topology(2, 2))           # a partly filled node is allowed


@pytest.mark.parametrize(
    "bad, error",
    [
        (dict(nodes=0, per_node=2), ValueError),
        (dict(nodes=2, per_node=2.0), ValueError),
        (dict(nodes=2, per_node=2, network="mesh"), ValueError),
        (dict(nodes=2, per_node=2, intra=1e-6), TypeError),
    ],
)
def test_bad_topologies_are_refused(bad, error):
    with pytest.raises(error):
        Topology(**bad)


def test_a_link_that_is_neither_is_refused():
    with pytest.raises(TypeError, match="LinkModel or a Topology"):
        run(ping_everyone, 2, link=(1e-6, 1e-9))


def test_groups_across_nodes_names_the_groups_that_leave_a_node():
    from minidist.cluster.topology import groups_across_nodes

    def fn(comm):
        pairs = groups_across_nodes(comm, lambda r: r // 2)           # (0, 1), (2, 3), ...: inside nodes
        stripes = groups_across_nodes(comm, lambda r: r % 2)          # even and odd ranks: both nodes
        sub = comm.split(color=comm.rank % 4, key=comm.rank)          # ranks {q, q + 4}: nodes 0 and 1
        return pairs, stripes, groups_across_nodes(sub, lambda r: 0)

    topo = Topology(2, 4, intra=LinkModel(), inter=LinkModel(beta=1e-9))
    for pairs, stripes, sub in run(fn, 8, link=topo):
        assert pairs == {} and stripes == {0: [0, 1], 1: [0, 1]} and sub == {0: [0, 1]}
    assert run(lambda comm: groups_across_nodes(comm, lambda r: r % 2), 2) == [{}, {}]   # no Topology
