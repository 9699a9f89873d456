"""Wrong all-reduces fail first with a diagnosing message (issue 55): each ring, tree and parameter-server
mutant of `exercises mutants`, five more wrong rings (off-by-one chunk, wrong direction, missing
reduction, wrong order, in-place aliasing) and two more wrong trees and servers, planted with mutants.py's
machinery, are named by phase and step, tree level, or the rank whose gradient is missing; wrong
hierarchical all-reduces by the level (inside the node, across nodes), the rank and the element; wrong
bucketed allreduces (dp_bucketed_allreduce) by the gradient, element and rank, or the allreduce count."""

import sys
import types
from pathlib import Path

import pytest

import minidist.collectives.hierarchical as hierarchical
import minidist.parallel.data.buckets as buckets
import tests.collectives.ring_diagnosis as diagnosis
import tests.collectives.tree_server_diagnosis as tree_server
from minidist.cluster import ClusterError, run
from minidist_course.mutants import MUTANTS, RING, RING_STEP, SERVER, TREE, Mutant, mutated_source
from tests.collectives.hierarchical_diagnosis import diagnose_hierarchical
from tests.parallel.bucket_diagnosis import diagnose_bucket

ROOT = Path(__file__).resolve().parent.parent
if "# BEGIN SOLUTION ring_allreduce" not in (ROOT / "minidist/collectives/ring.py").read_text():
    pytest.skip("a student copy: the reference solutions these tests use are cut", allow_module_level=True)
GATHER_STEP = ("comm.sendrecv(ring_chunk(flat, p, r - s), dst=(r + 1) % p, src=(r - 1) % p, sendtag=tag,\n"
               "                      recvtag=tag, out=ring_chunk(flat, p, r - s - 1))")
SCATTER_LOOP = "for s in range(p - 1):  # send my chunk right"
OFF_BY_ONE = Mutant("ring_allreduce", "off-by-one chunk: reduce-scatter sends chunk r - s (issue 55)", RING,
                    "comm.sendrecv(ring_chunk(flat, p, r - s - 1)",
                    "comm.sendrecv(ring_chunk(flat, p, r - s)")
WRONG_RINGS = (
    OFF_BY_ONE,
    Mutant("ring_allreduce", "off-by-one chunk: all-gather sends the chunk it has not got", RING, GATHER_STEP,
           GATHER_STEP.replace("ring_chunk(flat, p, r - s)", "ring_chunk(flat, p, r - s + 1)")),
    Mutant("ring_allreduce", "wrong direction: reduce-scatter sends left", RING,
           RING_STEP,
           RING_STEP.replace("dst=(r + 1) % p, src=(r - 1) % p", "dst=(r - 1) % p, src=(r + 1) % p")),
    Mutant("ring_allreduce", "missing reduction: reduce-scatter overwrites", RING,
           "out=ring_chunk(flat, p, r - s - 2), op=op)", "out=ring_chunk(flat, p, r - s - 2))"),
    Mutant("ring_allreduce", "wrong order: reduce-scatter steps backwards", RING, SCATTER_LOOP,
           SCATTER_LOOP.replace("range(p - 1)", "reversed(range(p - 1))")),
    Mutant("ring_allreduce", "in-place aliasing: all-gather receives into the chunk it sends", RING,
           GATHER_STEP,
           GATHER_STEP.replace("out=ring_chunk(flat, p, r - s - 1)", "out=ring_chunk(flat, p, r - s)")),
)
WRONG_TREES = (
    Mutant("tree_allreduce", "missing reduction: the reduce overwrites with the child's sum", TREE,
           "comm.recv(r + mask, tag=tag, out=flat, op=op)", "comm.recv(r + mask, tag=tag, out=flat)"),
    Mutant("tree_allreduce", "in-place aliasing: receives the child into flat, adds flat to itself",
           TREE,
           "comm.recv(r + mask, tag=tag, out=flat, op=op)",
           "incoming = comm.recv(r + mask, tag=tag, out=flat)\n            flat += incoming"),
)
WRONG_SERVERS = (
    Mutant("parameter_server_allreduce", "off-by-one: the server skips the last worker", SERVER,
           "    for worker in range(p):  # reduce", "    for worker in range(p - 1):  # reduce"),
    Mutant("parameter_server_allreduce", "wrong order: each worker gets the total so far", SERVER,
           "op=op)\n    for worker in range(p):\n        if worker != root:\n            comm.send(",
           "op=op)\n            comm.send("),
)
CASES = [m for m in MUTANTS if m.path == RING] + list(WRONG_RINGS)
TREE_CASES = [m for m in MUTANTS if m.path in (TREE, SERVER)] + list(WRONG_TREES + WRONG_SERVERS)
NAMES_A_PHASE = ("reduce-scatter step", "after reduce-scatter", "after all-gather", "all-gather step",
                 "all-gather (step", "reduce-scatter (step", "with op=")
NAMES_A_LEVEL_OR_RANK = ("tree reduce, level", "tree broadcast: rank", "parameter server: ", "with op=")


def first_diagnosis(monkeypatch, mutant: Mutant) -> str:
    """What the diagnosing checks say of a mutated ring.py (the ranks fork, so they run the mutant)."""
    module = types.ModuleType("mutated_ring")
    exec(compile(mutated_source(ROOT, mutant), RING, "exec"), module.__dict__)
    monkeypatch.setattr(diagnosis, "ring_reduce_scatter", module.ring_reduce_scatter)
    monkeypatch.setattr(diagnosis, "ring_allgather", module.ring_allgather)
    try:
        found = diagnosis.diagnose_ring(run(diagnosis.ring_trace, 4, 8, timeout=30), 8) or \
            diagnosis.diagnose_ring_op(run(diagnosis.ring_trace, 3, 7, "max", timeout=30), 7, "max")
    except ClusterError as err:
        found = str(err)
    assert found, f"{mutant.kind}: the diagnosing checks found nothing wrong"
    return found


@pytest.mark.parametrize("mutant", CASES, ids=[m.kind.split(":")[0] + f"-{i}" for i, m in enumerate(CASES)])
def test_a_wrong_ring_is_named_by_phase_step_and_chunk(monkeypatch, mutant):
    message = first_diagnosis(monkeypatch, mutant)
    print(f"{mutant.kind}: {message}")
    assert any(phrase in message for phrase in NAMES_A_PHASE), f"{mutant.kind}: {message}"
    assert "rank" in message, f"{mutant.kind}: {message}"


def test_the_off_by_one_ring_is_told_which_chunk_it_holds(monkeypatch):
    message = first_diagnosis(monkeypatch, OFF_BY_ONE)
    assert message == ("after reduce-scatter step 0, rank 0 should hold the partial sum of chunk 2 over "
                       "ranks [0, 3]; it holds rank 0's chunk 2 + rank 3's chunk 3"), message


def tree_server_diagnosis(monkeypatch, mutant: Mutant) -> str:
    module = types.ModuleType("mutated")
    exec(compile(mutated_source(ROOT, mutant), mutant.path, "exec"), module.__dict__)
    algorithm = "tree" if mutant.path == TREE else "parameter_server"
    monkeypatch.setattr(tree_server, f"{algorithm}_allreduce", getattr(module, f"{algorithm}_allreduce"))
    diagnose = tree_server.diagnose_tree if mutant.path == TREE else tree_server.diagnose_server
    try:
        found = diagnose(run(tree_server.traffic_trace, 5, algorithm, 3, timeout=30)) or \
            tree_server.diagnose_op(run(tree_server.traffic_trace, 5, algorithm, 3, "max", timeout=30), "max")
    except ClusterError as err:
        found = str(err)
    assert found, f"{mutant.kind}: the diagnosing checks found nothing wrong"
    return found


@pytest.mark.parametrize("mutant", TREE_CASES, ids=[f"{m.exercise[:4]}-{m.kind.split(':')[0]}-{i}"
                                                    for i, m in enumerate(TREE_CASES)])
def test_a_wrong_tree_or_server_is_named_by_level_or_missing_rank(monkeypatch, mutant):
    message = tree_server_diagnosis(monkeypatch, mutant)
    print(f"{mutant.kind}: {message}")
    assert any(phrase in message for phrase in NAMES_A_LEVEL_OR_RANK), f"{mutant.kind}: {message}"
    assert "rank" in message, f"{mutant.kind}: {message}"


HIERARCHICAL = "minidist/collectives/hierarchical.py"
WRONG_HIERARCHICAL = (
    Mutant("hierarchical_allreduce", "missing level: no allreduce across nodes", HIERARCHICAL,
           "    piece = recursive_doubling_allreduce(inter, piece, op)  # 2.", "    # 2."),
    Mutant("hierarchical_allreduce", "wrong order: the pieces gathered in reverse", HIERARCHICAL,
           "np.concatenate(allgather(intra, piece))", "np.concatenate(allgather(intra, piece)[::-1])"),
    Mutant("hierarchical_allreduce", "wrong group: the second level inside the node again", HIERARCHICAL,
           "piece = recursive_doubling_allreduce(inter, piece, op)  # 2.",
           "piece = recursive_doubling_allreduce(intra, piece, op)  # 2."),
)
NAMES_A_HIERARCHICAL_LEVEL = ("after the reduce-scatter inside node", "after the allreduce across nodes",
                              "after the allgather inside node")


@pytest.mark.parametrize("mutant", WRONG_HIERARCHICAL, ids=[m.kind.split(":")[0] for m in WRONG_HIERARCHICAL])
def test_a_wrong_hierarchical_allreduce_is_named_by_level_rank_and_element(monkeypatch, mutant):
    module = types.ModuleType("minidist.collectives._mutated")
    module.__package__ = "minidist.collectives"
    exec(compile(mutated_source(ROOT, mutant), HIERARCHICAL, "exec"), module.__dict__)
    monkeypatch.setattr(hierarchical, "hierarchical_allreduce", module.hierarchical_allreduce)
    message = diagnose_hierarchical(2, 2, 8) or diagnose_hierarchical(2, 3, 5)   # 8: even pieces, no crash
    print(f"{mutant.kind}: {message}")
    assert message is not None, f"{mutant.kind}: nothing found"
    assert any(level in message for level in NAMES_A_HIERARCHICAL_LEVEL) and ", rank " in message, \
        f"{mutant.kind}: {message}"
    assert "element " in message or "holds shape" in message, f"{mutant.kind}: {message}"


BUCKETS = "minidist/parallel/data/buckets.py"
BUCKET_ALLREDUCE = '    allreduce(comm, flat, op="sum", algorithm=algorithm, out=flat)\n'
WRONG_BUCKETS = (
    Mutant("dp_bucketed_allreduce", "wrong traffic: one allreduce per gradient", BUCKETS, BUCKET_ALLREDUCE,
           '    for g in grads:\n        allreduce(comm, g.reshape(-1), op="sum", algorithm=algorithm, '
           'out=g.reshape(-1))\n    flat = np.concatenate([g.ravel() for g in grads])\n'),
    Mutant("dp_bucketed_allreduce", "off-by-one: the offset advances by g.size - 1", BUCKETS,
           "        offset += g.size\n", "        offset += g.size - 1\n"),
    Mutant("dp_bucketed_allreduce", "in-place aliasing: rebinds g instead of writing into it", BUCKETS,
           "g[...] = flat[offset:offset + g.size].reshape(g.shape)",
           "g = flat[offset:offset + g.size].reshape(g.shape)"),
    Mutant("dp_bucketed_allreduce", "wrong order: the gradients flattened in reverse", BUCKETS,
           "np.concatenate([g.ravel() for g in grads], out=buffer)",
           "np.concatenate([g.ravel() for g in grads[::-1]], out=buffer)"),
)


@pytest.mark.parametrize("mutant", WRONG_BUCKETS, ids=[m.kind.split(":")[0] for m in WRONG_BUCKETS])
def test_a_wrong_bucketed_allreduce_is_named_by_gradient_element_and_rank(monkeypatch, mutant):
    module = types.ModuleType("minidist.parallel.data._mutated")
    module.__package__ = "minidist.parallel.data"
    monkeypatch.setitem(sys.modules, module.__name__, module)      # its @dataclass looks itself up there
    exec(compile(mutated_source(ROOT, mutant), BUCKETS, "exec"), module.__dict__)
    monkeypatch.setattr(buckets, "allreduce_bucket", module.allreduce_bucket)
    message = diagnose_bucket(2) or diagnose_bucket(3)
    print(f"{mutant.kind}: {message}")
    assert message is not None and message.startswith("allreduce_bucket over ") and ": rank " in message, \
        f"{mutant.kind}: {message}"
    assert "gradient " in message or "ONE allreduce" in message, f"{mutant.kind}: {message}"
