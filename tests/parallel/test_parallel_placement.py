"""Placing a data × pipeline × tensor mesh (lesson 15): ``Mesh`` numbers its ranks tensor-fastest, so a
tensor group is consecutive ranks and stays inside a node; a mesh built on a renumbered communicator
(``comm.split(0, key)``, data fastest) puts each tensor group across nodes. Either way ``parallelize``
trains a tiny GPT like one process, per parameter after several steps, with any schedule and several
micro-batches."""

import numpy as np
import pytest

from minidist.cluster import ClusterError, LinkModel, Topology, run
from minidist.cluster.topology import groups_across_nodes
from minidist.nn import GPT, CrossEntropyLoss
from minidist.optim import SGD
from minidist.parallel import Mesh, MeshShape, parallelize

STEPS, N, T, V = 3, 8, 8, 11
ORDER = ("data", "pipeline", "tensor")                       # Mesh's rank order (slowest first)


def make_gpt():
    return GPT(V, T, 2, 8, 2, rng=np.random.default_rng(1), dtype=np.float64)


def data():
    rng = np.random.default_rng(2)
    return rng.integers(0, V, size=(N, T)), rng.integers(0, V, size=(N, T))


def reference():
    model, (x, y) = make_gpt(), data()
    opt, loss_fn, losses = SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), []
    for _ in range(STEPS):
        opt.zero_grad()
        losses.append(loss_fn.forward(model.forward(x), y))
        model.backward(loss_fn.backward())
        opt.step()
    return model.state_dict(), losses


def across(comm, sizes: dict):
    """comm renumbered so that a Mesh of ``sizes`` over it has the data index fastest: world rank r takes
    the mesh rank of its coordinates in the reversed order (tensor, pipeline, data)."""
    reverse = MeshShape([(a, sizes[a]) for a in reversed(ORDER)])
    return comm.split(0, key=MeshShape([(a, sizes[a]) for a in ORDER]).rank(reverse.coords(comm.rank)))


def train(comm, sizes, placement, micro_batches=1, schedule="1f1b"):
    placed = across(comm, sizes) if placement == "tensor_across" else comm
    trainer = parallelize(make_gpt(), Mesh(placed, **sizes), loss_fn=CrossEntropyLoss(),
                          optimizer=lambda params: SGD(params, lr=0.1), micro_batches=micro_batches,
                          schedule=schedule)
    x, y = data()
    losses = [trainer.train_step(x, y) for _ in range(STEPS)]
    return trainer.full_state_dict(), losses


def check(results):
    expected, expected_losses = reference()
    for state, losses in results:
        for name, value in expected.items():
            np.testing.assert_allclose(state[name], value, rtol=1e-10, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(losses, expected_losses, rtol=1e-12)


@pytest.mark.parametrize("placement", ["tensor_inside", "tensor_across"])
@pytest.mark.parametrize("d, p, t", [(2, 2, 1), (1, 2, 2), (2, 1, 2)])
def test_placed_mesh_trains_like_one_process(d, p, t, placement):
    check(run(train, d * p * t, {"data": d, "pipeline": p, "tensor": t}, placement, timeout=180))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_placed_mesh_with_micro_batches_trains_like_one_process(schedule):
    """The pipeline axis runs any schedule on M micro-batches per data group; the first step's loss is
    the whole batch's before any update."""
    results = run(train, 4, {"data": 2, "pipeline": 2}, "tensor_inside", 2, schedule, timeout=180)
    check(results)
    model, (x, y) = make_gpt(), data()
    assert np.isclose(results[0][1][0], CrossEntropyLoss().forward(model.forward(x), y), rtol=1e-12)


def test_placement_puts_tensor_groups_inside_or_across_nodes():
    sizes = {"data": 2, "pipeline": 2, "tensor": 2}

    def fn(comm, placement):
        mesh = Mesh(across(comm, sizes) if placement == "tensor_across" else comm, **sizes)
        spans = groups_across_nodes(mesh.comm, lambda r: tuple(mesh.shape.group_ranks(r, "tensor")))
        return tuple(mesh.coords[a] for a in ORDER), spans

    topo = Topology(2, 4, intra=LinkModel(), inter=LinkModel(beta=1e-9))
    inside = run(fn, 8, "tensor_inside", link=topo)
    assert [c for c, _ in inside] == [(r // 4, r // 2 % 2, r % 2) for r in range(8)]
    assert all(spans == {} for _, spans in inside)
    assert [c for c, _ in run(fn, 8, "tensor_across", link=topo)] == [(r % 2, r // 2 % 2, r // 4)
                                                                        for r in range(8)]
    assert all(len(spans) == 4 for _, spans in run(fn, 8, "tensor_across", link=topo))


def test_a_mesh_of_the_wrong_size_is_refused():
    with pytest.raises(ClusterError, match="multiply to 12, but the world size is 8"):
        run(lambda comm: Mesh(comm, data=2, pipeline=2, tensor=3), 8)
