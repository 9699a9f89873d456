"""One count everywhere (issue 55): `exercises list`, `pytest --exercise ID` and the grader report the same
number of tests for every exercise; no test that needs an extra beside the oracles is among them."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minidist_course.classroom import grade_submission
from minidist_course.own_tests import ORACLES, extras_of, own_tests
from minidist_course.student_copy import make_student_copy

ROOT = Path(__file__).resolve().parent.parent
if "# BEGIN SOLUTION ring_allreduce" not in (ROOT / "minidist/collectives/ring.py").read_text():
    pytest.skip("a student copy: the reference solutions these tests use are cut", allow_module_level=True)
LISTED = re.compile(r"^(?P<id>\w+)\s+(?P<own>\d+) own tests,", re.M)


def listed_counts() -> dict[str, int]:
    out = subprocess.run([sys.executable, "-m", "minidist", "exercises", "list"],
                         cwd=ROOT, capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return {m["id"]: int(m["own"]) for m in LISTED.finditer(out.stdout)}


def test_exercises_list_and_pytest_count_the_same_tests(tmp_path):
    counts_file = tmp_path / "counts.json"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "-p", "tests.count_plugin", "--collect-only", "tests"],
                   cwd=ROOT, capture_output=True, check=False,
                   env=dict(os.environ, PYTHONPATH=str(ROOT), MINIDIST_COUNTS_OUT=str(counts_file)))
    selected = json.loads(counts_file.read_text())
    listed = listed_counts()
    assert listed, "exercises list printed no counts"
    differ = {ex: (n, selected.get(ex, 0)) for ex, n in listed.items() if n != selected.get(ex, 0)}
    assert not differ, f"{{exercise: (exercises list, pytest --exercise)}} differ: {differ}"


def test_no_own_test_needs_an_extra_beside_the_oracles():
    for exercise, tests in own_tests(ROOT).items():
        for test in tests:
            needs = extras_of(ROOT, test)
            assert needs <= set(ORACLES), f"{exercise}: {test} needs {needs}"


def test_the_grader_counts_what_the_list_says(tmp_path):
    chosen = ["stale_synchronous_bound", "error_feedback"]
    student = tmp_path / "student"
    make_student_copy(ROOT, student, keep=chosen)
    report = grade_submission(student, ROOT, exercises=chosen, timeout=60.0)
    listed = listed_counts()
    for result in report.exercises:
        assert (result.passed, result.total + result.skipped) == (listed[result.exercise],) * 2, \
            f"{result.exercise}: the grader ran {result.passed}/{result.total} " \
            f"(+{result.skipped} skipped), exercises list says {listed[result.exercise]}"
