"""Wrong rings fail first with a diagnosing message (issue 55): each ring mutant of `exercises mutants`
and five more wrong solutions (off-by-one chunk, wrong direction, missing reduction, wrong order,
in-place aliasing), planted with mutants.py's machinery, are named by phase, step and chunk."""

import types
from pathlib import Path

import pytest

import tests.collectives.ring_diagnosis as diagnosis
from minidist.cluster import ClusterError, run
from minidist_course.mutants import MUTANTS, RING, Mutant, mutated_source

ROOT = Path(__file__).resolve().parent.parent
GATHER_STEP = ("comm.sendrecv(ring_chunk(flat, p, r - s), dst=(r + 1) % p, src=(r - 1) % p, sendtag=tag,\n"
               "                      recvtag=tag, out=ring_chunk(flat, p, r - s - 1))")
SCATTER_LOOP = "for s in range(p - 1):  # send my chunk right"
OFF_BY_ONE = Mutant("ring_allreduce", "off-by-one chunk: reduce-scatter sends chunk r - s (issue 55)", RING,
                    "comm.sendrecv(ring_chunk(flat, p, r - s - 1)", "comm.sendrecv(ring_chunk(flat, p, r - s)")
WRONG_RINGS = (
    OFF_BY_ONE,
    Mutant("ring_allreduce", "off-by-one chunk: all-gather sends the chunk it has not got", RING, GATHER_STEP,
           GATHER_STEP.replace("ring_chunk(flat, p, r - s)", "ring_chunk(flat, p, r - s + 1)")),
    Mutant("ring_allreduce", "wrong direction: reduce-scatter sends left", RING,
           "dst=(r + 1) % p, src=(r - 1) % p, sendtag=tag,\n                      recvtag=tag, out=ring_chunk("
           "flat, p, r - s - 2)", "dst=(r - 1) % p, src=(r + 1) % p, sendtag=tag,\n                      "
           "recvtag=tag, out=ring_chunk(flat, p, r - s - 2)"),
    Mutant("ring_allreduce", "missing reduction: reduce-scatter overwrites", RING,
           "out=ring_chunk(flat, p, r - s - 2), op=op)", "out=ring_chunk(flat, p, r - s - 2))"),
    Mutant("ring_allreduce", "wrong order: reduce-scatter steps backwards", RING, SCATTER_LOOP,
           SCATTER_LOOP.replace("range(p - 1)", "reversed(range(p - 1))")),
    Mutant("ring_allreduce", "in-place aliasing: all-gather receives into the chunk it sends", RING,
           GATHER_STEP, GATHER_STEP.replace("out=ring_chunk(flat, p, r - s - 1)", "out=ring_chunk(flat, p, r - s)")),
)
CASES = [m for m in MUTANTS if m.path == RING] + list(WRONG_RINGS)
NAMES_A_PHASE = ("reduce-scatter step", "after reduce-scatter", "after all-gather", "all-gather step",
                 "all-gather (step", "reduce-scatter (step", "with op=")


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
