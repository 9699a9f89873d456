"""Hierarchical and 2-D torus allreduce: exact sums, bitwise equal on every rank, ledger and clock equal to
the closed forms of topology_cost.py, and clear errors."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from minidist.cluster import LinkModel, Topology, run, run_traced
from minidist.collectives import allreduce
from minidist.collectives.hierarchical import choose_by_topology
from minidist.collectives.topology_cost import flat_time, hierarchical_cost, hierarchical_speedup, torus_cost

# Powers of two keep most sums exact; the comparisons allow a last-bit rounding of the sums of terms.
INTRA, INTER = LinkModel(2.0**-20, 2.0**-33), LinkModel(2.0**-17, 2.0**-30)
COSTS = {"hierarchical": hierarchical_cost, "torus": torus_cost}


def _data(rank: int, n: int, dtype=np.float64) -> np.ndarray:
    return np.random.default_rng(rank).integers(-50, 50, n).astype(dtype)


def _measure(comm, n, algorithms):
    """Per algorithm: (result, stats difference, clock difference), clocks aligned by a barrier."""
    out = {}
    for algorithm in algorithms:
        comm.barrier()
        s, t = vars(comm.stats).copy(), comm.clock
        y = allreduce(comm, _data(comm.rank, n), algorithm=algorithm)
        out[algorithm] = (y, {k: v - s[k] for k, v in vars(comm.stats).items()}, comm.clock - t)
    return out


@pytest.mark.parametrize("nodes, per_node, network", [(2, 2, "switch"), (2, 4, "switch"), (4, 2, "switch"),
                                                      (4, 2, "ring"), (1, 4, "switch"), (4, 1, "ring")])
def test_ledger_and_clock_equal_the_closed_forms(nodes, per_node, network):
    topo = Topology(nodes, per_node, intra=INTRA, inter=INTER, network=network)
    n = 8 * 3 * nodes * per_node             # divides by G·N: the formulas are exact
    p = topo.size
    results = run(_measure, p, n, ("hierarchical", "torus", "ring"), link=topo)
    total = sum(_data(r, n) for r in range(p))
    for algorithm, cost_of in COSTS.items():
        cost = cost_of(topo, 8 * n)
        for y, stats, elapsed in (res[algorithm] for res in results):
            assert np.array_equal(y, total) and y.tobytes() == results[0][algorithm][0].tobytes()
            assert stats["bytes_sent"] == cost.bytes == stats["bytes_received"]
            assert stats["messages_sent"] == cost.messages == stats["messages_received"]
            assert elapsed == pytest.approx(cost.time, rel=1e-12)
    ring_time = max(res["ring"][2] for res in results)
    assert ring_time == pytest.approx(flat_time("ring", topo, p, 8 * n), rel=1e-12)
    for res in results:
        assert res["ring"][0].tobytes() == res["hierarchical"][0].tobytes() == res["torus"][0].tobytes()


def test_trace_levels_match_the_formula_per_level():
    topo = Topology(2, 4, intra=INTRA, inter=INTER)
    n = 8 * 8
    _, trace = run_traced(
        lambda comm: allreduce(comm, _data(comm.rank, n), algorithm="hierarchical"), 8, link=topo
    )
    cost = hierarchical_cost(topo, 8 * n)
    for rank in range(8):
        sends = [s for s in trace.rank_spans(rank) if s.kind == "send"]
        assert sum(s.nbytes for s in sends if s.level == "intra") == cost.intra_bytes
        assert sum(s.nbytes for s in sends if s.level == "inter") == cost.inter_bytes
        assert sum(s.level == "inter" for s in sends) == cost.inter_messages


@given(
    nodes=st.integers(1, 4),
    per_node=st.integers(1, 4),
    n=st.sampled_from([0, 1, 3, 7, 40, 101]),
    op=st.sampled_from(["sum", "mean", "max", "min"]),
    algorithm=st.sampled_from(["hierarchical", "torus"]),
    dtype=st.sampled_from([np.float64, np.float32, np.int64]),
)
def test_any_shape_of_cluster_gives_the_exact_result_on_every_rank(nodes, per_node, n, op, algorithm, dtype):
    assume(nodes * per_node <= 8 and not (op == "mean" and dtype == np.int64))
    topo = Topology(nodes, per_node, network="ring" if nodes % 2 else "switch")
    p = topo.size
    results = run(lambda comm: allreduce(comm, _data(comm.rank, n, dtype).reshape(-1, 1), op=op,
                                         algorithm=algorithm), p, link=topo)
    stack = np.stack([_data(r, n, dtype) for r in range(p)])
    reduce = {"sum": np.sum, "mean": np.sum, "max": np.max, "min": np.min}[op]
    expected = reduce(stack, axis=0)
    if op == "mean":
        expected = expected / dtype(p)
    for y in results:
        assert y.shape == (n, 1) and y.dtype == dtype
        assert y.tobytes() == results[0].tobytes()
        assert np.array_equal(y.ravel(), expected.astype(dtype))


def test_works_on_a_sub_communicator_with_equal_nodes():
    def fn(comm):
        half = comm.split(color=comm.rank % 2)               # 2 ranks on each of the 2 nodes
        return allreduce(half, np.array([float(comm.rank)]), algorithm="hierarchical"), half.stats.bytes_sent
    results = run(fn, 8, link=Topology(2, 4))
    assert [float(y[0]) for y, _ in results] == [12.0, 16.0] * 4
    assert all(sent > 0 for _, sent in results)



def test_needs_a_topology_and_equal_nodes():
    def attempt(comm, algorithm):
        try:
            allreduce(comm, np.ones(4), algorithm=algorithm)
        except ValueError as error:
            return str(error)
        return "no error"
    for algorithm in ("hierarchical", "torus"):
        assert all("needs a cluster topology" in e for e in run(attempt, 4, algorithm, link=LinkModel()))
        errors = run(attempt, 6, algorithm, link=Topology(2, 4))      # nodes of 4 and 2 ranks
        assert all("needs nodes of equal size" in e for e in errors)
    assert run(attempt, 2, "torous", link=Topology(1, 2))[0].startswith("algorithm must be one of")


def test_auto_chooses_by_topology_and_size():
    slow = Topology(2, 4, intra=LinkModel(5e-6, 1 / 100e9), inter=LinkModel(5e-6, 1 / 10e9))
    ring_of_nodes = Topology(4, 2, intra=LinkModel(5e-6, 1 / 100e9), inter=LinkModel(5e-6, 1 / 10e9),
                             network="ring")

    def choices(comm):
        return [choose_by_topology(comm, nbytes) for nbytes in (8, 2**26)]
    assert run(choices, 8, link=slow)[0] == [None, "hierarchical"]
    assert run(choices, 8, link=ring_of_nodes)[0] == [None, "torus"]
    assert run(choices, 4, link=LinkModel())[0] == [None, None]
    assert run(choices, 6, link=slow)[0] == [None, None]               # unequal nodes: the classic rule
    results = run(lambda comm: allreduce(comm, _data(comm.rank, 3), algorithm="auto"), 8, link=slow)
    assert all(np.array_equal(y, sum(_data(r, 3) for r in range(8))) for y in results)


def test_the_predicted_speedup_with_a_ten_times_slower_network():
    topo = Topology(2, 4, intra=LinkModel(0, 1 / 100e9), inter=LinkModel(0, 1 / 10e9))
    # flat ring 2·7/8·n·β_e = 1.75 n β_e; hierarchical 2·3/4·n·β_i + n/4·β_e = 0.4 n β_e
    assert hierarchical_speedup(topo, 2**20) == pytest.approx(1.75 / 0.4, rel=1e-12)
    with pytest.raises(ValueError, match="nbytes"):
        hierarchical_cost(topo, -1)
    with pytest.raises(TypeError):
        torus_cost(LinkModel(), 8)
