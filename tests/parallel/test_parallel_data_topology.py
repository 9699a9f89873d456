"""DataParallel on a two-level cluster: the hierarchical, torus and auto allreduce of its gradient buckets
train exactly as one process (float64, per parameter, several steps), and every step's ledger bytes are
the closed form of topology_cost.py summed over the buckets."""

import numpy as np
import pytest

from minidist.cluster import LinkModel, Topology, run
from minidist.collectives.hierarchical import choose_by_topology
from minidist.collectives.topology_cost import hierarchical_cost, torus_cost
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD
from minidist.parallel.data import DataParallel

STEPS = 4
COSTS = {"hierarchical": hierarchical_cost, "torus": torus_cost}
# A network 10x slower than the node's links, whose latency dwarfs theirs: "auto" then takes the
# hierarchical allreduce even for the smallest bucket (32 bytes), so its formula is checked too.
TOPO = Topology(2, 2, intra=LinkModel(1e-9, 1 / 100e9), inter=LinkModel(1e-5, 1 / 10e9))


def make_model() -> Sequential:
    rng = np.random.default_rng(5)     # 48 + 8 + 32 + 4 parameters: every bucket divides by G·N = 4
    return Sequential(Linear(6, 8, rng=rng, dtype=np.float64), ReLU(),
                      Linear(8, 4, rng=rng, dtype=np.float64))


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(6)
    return [(rng.standard_normal((10, 6)), rng.integers(0, 4, 10)) for _ in range(STEPS)]


def single_process() -> list[np.ndarray]:
    model = make_model()
    opt, loss_fn = SGD(model.parameters(), lr=0.1, momentum=0.9), CrossEntropyLoss()
    for x, y in batches():
        opt.zero_grad()
        loss_fn.forward(model.forward(x), y)
        model.backward(loss_fn.backward())
        opt.step()
    return [p.data for p in model.parameters()]


def train(comm, algorithm, bucket_bytes):
    model = make_model()
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    dp = DataParallel(comm, model, opt, CrossEntropyLoss(), algorithm=algorithm, bucket_bytes=bucket_bytes)
    sent = []
    for x, y in batches():
        before = comm.stats.bytes_sent
        dp.train_step(x, y)
        sent.append(comm.stats.bytes_sent - before)
    chosen = [choose_by_topology(comm, b.nbytes) for b in dp.buckets]
    return [p.data for p in model.parameters()], sent, [b.nbytes for b in dp.buckets], chosen


@pytest.mark.parametrize("algorithm", ["hierarchical", "torus", "auto"])
@pytest.mark.parametrize("bucket_bytes", [None, 25 * 2**20], ids=["per_parameter", "one_bucket"])
def test_data_parallel_on_a_topology_equals_one_process_and_the_formula(algorithm, bucket_bytes):
    reference = single_process()
    results = run(train, TOPO.size, algorithm, bucket_bytes, link=TOPO)
    for rank, (params, sent, bucket_nbytes, chosen) in enumerate(results):
        assert [p.tobytes() for p in params] == [p.tobytes() for p in results[0][0]], f"rank {rank} differs"
        for got, want in zip(params, reference, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
        names = chosen if algorithm == "auto" else [algorithm] * len(bucket_nbytes)
        assert all(name in COSTS for name in names), f"auto chose {chosen}: no topology algorithm to check"
        per_step = sum(COSTS[name](TOPO, nbytes).bytes
                       for name, nbytes in zip(names, bucket_nbytes, strict=True))
        assert len(bucket_nbytes) == (4 if bucket_bytes is None else 1)
        assert sent == [per_step] * STEPS


def test_topology_algorithms_need_a_topology_with_equal_nodes():
    def build(comm, algorithm):
        model = make_model()
        try:
            DataParallel(comm, model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(),
                         algorithm=algorithm)
        except ValueError as error:
            return str(error)
        return None

    assert all("needs a cluster topology" in e for e in run(build, 2, "hierarchical"))
    assert all("nodes of equal size" in e for e in run(build, 3, "torus", link=Topology(2, 2)))
    assert all("algorithm must be one of" in e for e in run(build, 2, "hierarchy", link=Topology(1, 2)))
    assert run(build, 4, "hierarchical", link=Topology(2, 2)) == [None] * 4
