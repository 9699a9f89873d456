"""Grading the real library: a student copy with ring_allreduce solved scores full marks on it and zero on
the exercise still cut; a ring allreduce that skips its allgather scores at most 10%."""

import re
from pathlib import Path

import pytest

from minidist_course import grade, make_student_copy, splice_functions
from minidist_course.student_copy import HITS_MODULE, STUDENT_STAMP

ROOT = Path(__file__).resolve().parent.parent
# A student copy (solutions cut) or the map's instrumented copy (markers replaced) holds no reference
# solutions to grade against; the reference tree always does, and there this test must run.
MADE_BY_THE_TOOLING = (ROOT / STUDENT_STAMP).exists() or (ROOT / f"{HITS_MODULE}.py").exists()
RING = "minidist/collectives/ring.py"
ALLGATHER_LOOP = re.compile(r"\n    for s in range\(p - 1\):  # pass the finished.*?\n"
                            r"(?=    return flat)", re.DOTALL)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(MADE_BY_THE_TOOLING, reason="a student or instrumented copy holds no reference solutions")
def test_ring_allreduce_round_trip_through_the_grader(tmp_path):
    student = tmp_path / "student"
    make_student_copy(ROOT, student, only=["ring_allreduce", "parameter_server_allreduce"])
    cut = (student / RING).read_text()
    assert "raise NotImplementedError('exercise ring_allreduce" in cut

    solved = splice_functions(cut, (ROOT / RING).read_text(), {"ring_reduce_scatter", "ring_allgather"})
    (student / RING).write_text(solved)
    scores = {r.exercise: r for r in grade(student, ROOT, exercises=["ring_allreduce",
                                                                     "parameter_server_allreduce"])}
    ring, server = scores["ring_allreduce"], scores["parameter_server_allreduce"]
    assert ring.total > 0 and ring.passed == ring.total, ring
    assert server.total > 0 and server.passed == 0, server

    without_allgather, removed = ALLGATHER_LOOP.subn("\n", solved)
    assert removed == 1, "the reference ring changed shape: update ALLGATHER_LOOP"
    (student / RING).write_text(without_allgather)
    [wrong] = grade(student, ROOT, exercises=["ring_allreduce"])
    assert wrong.total == ring.total and wrong.passed <= 0.1 * wrong.total, wrong
