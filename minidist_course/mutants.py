"""Wrong but non-trivial solutions (mutants) that an exercise's own tests must mark down to at most half.

The stand-ins (standins.py) are trivially wrong; a mutant is a solution a student could hand in: an index
off by one, the wrong op, the right values with the wrong traffic. Each is the reference with one edit
(``old`` -> ``new``, which must occur exactly once, so a reference that changes shape fails loudly
here). ``python -m minidist exercises mutants`` (CI) grades each as a submission of its exercise alone
and fails if one scores more than MAX_SCORE: a test suite that lets such a solution keep more than half
the marks does not check what the statement promises (registry.py weighs the promises).
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from minidist.nn.checks import check_count

from .grade import Job, Reference, run_job
from .results import ExerciseResult, score_exercises

MAX_SCORE = 0.5


@dataclass(frozen=True)
class Mutant:
    exercise: str
    kind: str        # what is wrong, in a few words
    path: str        # the file edited
    old: str
    new: str


RING, TREE, SERVER = ("minidist/collectives/ring.py", "minidist/collectives/tree.py",
                      "minidist/collectives/allreduce.py")
LAMB, SOFTMAX = "minidist/optim/lamb.py", "minidist/nn/softmax.py"
RING_STEP = ("comm.sendrecv(ring_chunk(flat, p, r - s - 1), dst=(r + 1) % p, src=(r - 1) % p, sendtag=tag,\n"
             "                      recvtag=tag, out=ring_chunk(flat, p, r - s - 2), op=op)")
TREE_REDUCE = """\
    while mask < p:  # reduce: add the children's partial sums, then hand ours to the parent
        if r & mask:
            comm.send(flat, dst=r - mask, tag=tag)
            break
        if r + mask < p:
            comm.recv(r + mask, tag=tag, out=flat, op=op)
        mask <<= 1
"""
SERVER_BODY = """\
    if r != root:
        comm.send(flat, dst=root, tag=tag)
        return comm.recv(root, tag=tag, out=flat)
"""

MUTANTS = (
    Mutant("ring_allreduce", "off-by-one chunk: adds into the chunk it sends", RING, RING_STEP,
           RING_STEP.replace("out=ring_chunk(flat, p, r - s - 2)", "out=ring_chunk(flat, p, r - s - 1)")),
    Mutant("ring_allreduce", "wrong op: always sums", RING, RING_STEP,
           RING_STEP.replace("op=op)", 'op="sum")')),
    Mutant("ring_allreduce", "wrong traffic: whole arrays around the ring, the right values", RING, RING_STEP,
           "from minidist.collectives.common import UFUNCS\n"
           "        incoming = comm.sendrecv(flat.copy(), dst=(r + 1) % p, src=(r - 1) % p, sendtag=tag,\n"
           "                                 recvtag=tag)\n"
           "        mine = ring_chunk(flat, p, r - s - 2)\n"
           "        UFUNCS[op](mine, ring_chunk(incoming, p, r - s - 2), out=mine)"),
    Mutant("tree_allreduce", "wrong op: the broadcast adds the parent's total", TREE,
           "comm.recv(r - mask, tag=tag, out=flat)", "comm.recv(r - mask, tag=tag, out=flat, op=op)"),
    Mutant("tree_allreduce", "wrong op: always sums", TREE, "comm.recv(r + mask, tag=tag, out=flat, op=op)",
           'comm.recv(r + mask, tag=tag, out=flat, op="sum")'),
    Mutant("tree_allreduce", "wrong traffic: everyone sends straight to rank 0, the right values", TREE,
           TREE_REDUCE, """\
    if r:  # reduce: every rank straight to rank 0 (a star, not a tree)
        comm.send(flat, dst=0, tag=tag)
    else:
        for src in range(1, p):
            comm.recv(src, tag=tag, out=flat, op=op)
"""),
    Mutant("parameter_server_allreduce", "wrong op: the server overwrites instead of reducing", SERVER,
           "comm.recv(worker, tag=tag, out=flat, op=op)", "comm.recv(worker, tag=tag, out=flat)"),
    Mutant("parameter_server_allreduce", "wrong op: always sums", SERVER,
           "comm.recv(worker, tag=tag, out=flat, op=op)", 'comm.recv(worker, tag=tag, out=flat, op="sum")'),
    Mutant("parameter_server_allreduce", "wrong traffic: everyone sends to everyone, the right values",
           SERVER, SERVER_BODY, """\
    mine = flat.copy()
    for other in range(p):  # everyone to everyone: no server
        if other != r:
            comm.send(mine, dst=other, tag=tag)
    for other in range(p):
        if other != r:
            comm.recv(other, tag=tag, out=flat, op=op)
    return flat
"""),
    Mutant("lamb_trust_ratio", "wrong op: |u| / |w|", LAMB, "return w_norm / u_norm",
           "return u_norm / w_norm"),
    Mutant("lamb_trust_ratio", "wrong op: squared norms", LAMB, "w_norm, u_norm = norm(w), norm(update)",
           "w_norm, u_norm = norm(w) ** 2, norm(update) ** 2"),
    Mutant("lamb_trust_ratio", "off by one case: no guard for a zero layer", LAMB,
           "if w_norm == 0.0 or u_norm == 0.0:", "if u_norm == 0.0:"),
    Mutant("softmax_backward", "wrong axis: always the last", SOFTMAX,
           "(dy * y).sum(axis=axis, keepdims=True)", "(dy * y).sum(axis=-1, keepdims=True)"),
    Mutant("softmax_backward", "wrong op: Σ dy instead of Σ dy ⊙ y", SOFTMAX,
           "(dy * y).sum(axis=axis, keepdims=True)", "dy.sum(axis=axis, keepdims=True)"),
    Mutant("softmax_backward", "wrong op: without the outer y ⊙", SOFTMAX,
           "return y * (dy - (dy * y).sum(axis=axis, keepdims=True))",
           "return dy - (dy * y).sum(axis=axis, keepdims=True)"),
)


def mutated_source(root: Path, mutant: Mutant) -> str:
    """The text of the mutated file: the reference's with ``old`` replaced once."""
    text = (Path(root) / mutant.path).read_text()
    if text.count(mutant.old) != 1:
        raise ValueError(f"mutant {mutant.exercise} ({mutant.kind}): its text occurs "
                         f"{text.count(mutant.old)} times in {mutant.path}, not once: update "
                         f"minidist_course/mutants.py")
    return text.replace(mutant.old, mutant.new)


def write_mutant(root: Path, dest: Path, mutant: Mutant) -> None:
    """A submission at dest holding the mutated file."""
    (dest / mutant.path).parent.mkdir(parents=True, exist_ok=True)
    (dest / mutant.path).write_text(mutated_source(root, mutant))


def grade_mutants(root: Path, exercises: list[str] | None = None, jobs: int = 2, timeout: float = 30.0,
                  echo=print) -> list[tuple[Mutant, ExerciseResult]]:
    """Grade every mutant of the given exercises (default: all) as a submission of its exercise alone."""
    jobs = check_count(jobs, "jobs")
    ref = Reference.read(root)
    if exercises is not None and not exercises:
        raise ValueError("exercises=[]: expected the ids of the exercises whose mutants to grade (None: all)")
    chosen = [m for m in MUTANTS if exercises is None or m.exercise in exercises]
    unknown = sorted(set(exercises or []) - {m.exercise for m in MUTANTS})
    if unknown:
        raise ValueError(f"no mutants for {unknown}; there are some for "
                         f"{sorted({m.exercise for m in MUTANTS})}")
    with tempfile.TemporaryDirectory(prefix="minidist-mutants-") as tmp:
        def one(i: int) -> tuple[Mutant, ExerciseResult]:
            mutant, work = chosen[i], Path(tmp) / f"m{i}"
            write_mutant(ref.root, work / "submission", mutant)
            (work / "session").mkdir()
            tests, errors, error, _s = run_job(Job(work / "submission", mutant.exercise, [mutant.exercise]),
                                               ref, work / "session", None, timeout, 300.0)
            [result], _ = score_exercises(tests, [mutant.exercise], errors or ({mutant.exercise: error}
                                                                             if error else {}), ref.promises)
            mark = "ok  " if result.score <= MAX_SCORE and result.total else "FAIL"
            echo(f"{mark} {mutant.exercise:28s} {result.score:4.2f} ({result.passed}/{result.total} tests)  "
                 f"{mutant.kind}")
            return mutant, result

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(one, range(len(chosen))))
