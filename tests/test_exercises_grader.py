"""The grader on the toy repository: selection by --exercise, own vs integration scores, reports, a class
in batch, and a submission that hangs (the grade ends within its limits and names the hung test)."""

import csv
import json
import os
import subprocess
import sys
import time

import pytest

from minidist.exercises import grade_submission, make_student_copy, splice_functions
from minidist.exercises.isolation import check_each_alone
from minidist.exercises.report import format_markdown, format_text, write_csv
from tests.test_exercises_tooling import TOY, toy_repo  # noqa: F401  (the fixture)


def pytest_ids(root, *args):
    """The test ids pytest selects in root with these arguments."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                           *args], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(root)))
    return sorted(line.split("::")[1] for line in done.stdout.splitlines() if "::" in line)


def test_exercise_option_selects_a_test_when_all_its_exercises_are_named(toy_repo):  # noqa: F811
    assert pytest_ids(toy_repo, "--exercise", "toy_add") == ["test_add"]
    assert pytest_ids(toy_repo, "--exercise", "toy_scale") == ["test_scale"]
    assert pytest_ids(toy_repo, "--exercise", "toy_add", "--exercise", "toy_scale") == [
        "test_add", "test_both", "test_scale"]


def test_keep_leaves_one_exercise_solved_and_the_copy_checks_it_alone(toy_repo, tmp_path):  # noqa: F811
    cut = make_student_copy(toy_repo, tmp_path / "s", keep=["toy_add"])
    assert cut == ["toy_scale"]
    text = (tmp_path / "s" / "minidist" / "toy.py").read_text()
    assert "return a + b" in text and "exercise toy_scale" in text
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--expect-exercises-cut"], cwd=tmp_path / "s", capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path / "s")))
    # test_add passes (toy_add kept); test_scale and test_both reach the cut toy_scale and fail (xfail)
    assert done.returncode == 0 and "2 passed, 2 xfailed" in done.stdout, done.stdout


def test_check_each_alone_passes_and_one_without_own_tests_fails_loudly(toy_repo, tmp_path):  # noqa: F811
    lines = []
    results = check_each_alone(toy_repo, jobs=2, echo=lines.append)
    assert [(r.exercise, r.own_tests, r.ok) for r in results] == [("toy_add", 1, True),
                                                                   ("toy_scale", 1, True)]
    assert "2/2 exercises pass their own tests alone" in lines[-1]

    mapping = json.loads((toy_repo / "tests" / "exercise_map.json").read_text())
    del mapping["tests/test_toy.py::test_scale"]       # toy_scale now reached only with toy_add
    original = (toy_repo / "tests" / "exercise_map.json").read_text()
    try:
        (toy_repo / "tests" / "exercise_map.json").write_text(json.dumps(mapping))
        [scale] = check_each_alone(toy_repo, ["toy_scale"], echo=lines.append)
    finally:
        (toy_repo / "tests" / "exercise_map.json").write_text(original)
    assert not scale.ok and scale.own_tests == 0 and "no own test" in scale.detail
    assert "FAILED: toy_scale" in lines[-1]


@pytest.mark.slow
def test_reports_and_a_class_in_batch(toy_repo, tmp_path):  # noqa: F811
    students = []
    for name, body in [("ann", "return a + b"), ("bob", "return a - b"), ("cy", None)]:
        make_student_copy(toy_repo, tmp_path / name)
        toy = tmp_path / name / "minidist" / "toy.py"
        if body:
            toy.write_text(splice_functions(toy.read_text(), TOY.replace("return a + b", body), {"add"}))
        students.append(grade_submission(tmp_path / name, toy_repo, workers=1))
    ann, bob, cy = students
    assert [r.score for r in ann.exercises] == [1.0, 0.0] and bob.exercises[0].score == 0.0
    assert ann.environment["numpy"] != "absent" and set(ann.environment) >= {"python", "torch", "ml_dtypes"}
    md = format_markdown(bob)
    assert "| `toy_add` | 0/1 | 0 | 0.00 |" in md and "`tests/test_toy.py::test_add` — failed:" in md
    assert "assert -1 == 5" in md and "toy_add + toy_scale" in md
    assert "integration tests" in format_text(bob)
    write_csv(students, tmp_path / "scores.csv")
    rows = list(csv.DictReader(open(tmp_path / "scores.csv")))
    assert [(r["student"], r["status"], r["toy_add"], r["toy_scale"]) for r in rows] == [
        ("ann", "graded", "1.0", "0.0"), ("bob", "graded", "0.0", "0.0"), ("cy", "graded", "0.0", "0.0")]
    assert json.loads(json.dumps(ann.as_dict()))["integration"][0]["name"] == "toy_add + toy_scale"


HANGING_ADD = '''\
def add(a, b):
    """Return a + b -- but first start a stray grandchild, then never return."""
    import os, subprocess, sys, time
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["TOY_PID_FILE"], "a") as f:
        f.write(f"{stray.pid}\\n")
    while True:
        time.sleep(0.05)
'''


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
@pytest.mark.parametrize("per_test, limit", [(3.0, 180.0), (600.0, 45.0)])
def test_a_hanging_submission_ends_in_time_and_names_the_hung_test(toy_repo, tmp_path,  # noqa: F811
                                                                    per_test, limit, monkeypatch):
    """Per-test timeout (pytest-timeout) or the submission's limit (the process group is killed): either
    way the grade ends, says which tests hung, and no process the student's code started survives."""
    student = tmp_path / "student"
    make_student_copy(toy_repo, student)
    toy = student / "minidist" / "toy.py"
    toy.write_text(splice_functions(toy.read_text(), HANGING_ADD, {"add"}))
    pid_file = tmp_path / "stray-pids"
    monkeypatch.setenv("TOY_PID_FILE", str(pid_file))
    start = time.monotonic()
    report = grade_submission(student, toy_repo, exercises=["toy_add"], timeout=per_test, limit=limit)
    elapsed = time.monotonic() - start
    assert elapsed < min(per_test + 60, limit + 15), elapsed
    assert report.hung == ["tests/test_toy.py::test_add"]
    assert report.status == ("graded" if per_test < limit else "timeout")
    [add] = report.exercises
    assert (add.passed, add.total, add.failing[0]["outcome"]) == (0, 1, "hung")
    pids = [int(p) for p in pid_file.read_text().split()]
    assert pids, "the hanging solution never ran"
    deadline = time.monotonic() + 5
    while pids and not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), pids
