"""The grader on the toy repository: selection by --exercise, own vs integration scores, reports, a class
in batch, isolation (a hang inside hypothesis, os._exit, a stray process: each costs only its own test),
and a directory that is not a copy of the course (refused at once)."""

import csv
import json
import os
import subprocess
import sys
import time

import pytest

from minidist_course import grade_class, grade_submission, make_student_copy, splice_functions
from minidist_course.isolation import check_each_alone
from minidist_course.report import format_markdown, format_text, write_csv
from tests.test_exercises_catalog import MADE_BY_THE_TOOLING
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
    lines = []
    students = grade_class([tmp_path / n for n in ("ann", "bob", "cy")], toy_repo, integration=True,
                           echo=lines.append)
    ann, bob, _cy = students
    assert [line.split(":")[0] for line in lines] == ["[1/3] ann", "[2/3] bob", "[3/3] cy"]
    assert "left" in lines[0] and "left" not in lines[2]
    assert [r.score for r in ann.exercises] == [1.0, 0.0] and bob.exercises[0].score == 0.0
    assert ann.environment["numpy"] != "absent" and set(ann.environment) >= {"python", "torch", "ml_dtypes"}
    md = format_markdown(bob)
    assert "| `toy_add` | 0/1 | 0.00 | `test_add` failed: assert -1 == 5" in md
    assert "Integration tests (not scored): toy_add + toy_scale 0/1." in md
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
def test_a_hanging_submission_is_killed_in_time_and_leaves_no_process(toy_repo, tmp_path, monkeypatch):  # noqa: F811
    """The per-test timeout is enforced from outside (the process group is killed): the grade ends, says
    which test hung, and no process the student's code started survives."""
    student = tmp_path / "student"
    make_student_copy(toy_repo, student)
    toy = student / "minidist" / "toy.py"
    toy.write_text(splice_functions(toy.read_text(), HANGING_ADD, {"add"}))
    pid_file = tmp_path / "stray-pids"
    monkeypatch.setenv("TOY_PID_FILE", str(pid_file))
    start = time.monotonic()
    report = grade_submission(student, toy_repo, exercises=["toy_add"], timeout=3.0)
    assert time.monotonic() - start < 60
    assert [(i["exercise"], i["test"], i["outcome"]) for i in report.incidents] == [
        ("toy_add", "tests/test_toy.py::test_add", "hung")]
    assert report.status == "incomplete"
    [add] = report.exercises
    assert (add.passed, add.total, add.failing[0]["outcome"]) == (0, 1, "hung")
    pids = [int(p) for p in pid_file.read_text().split()]
    assert pids, "the hanging solution never ran"
    deadline = time.monotonic() + 5
    while pids and not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), pids


# add exits the interpreter on a negative input; scale loops forever (no sleep) on a large one. Hidden
# hypothesis tests reach both cases; the public tests (2 + 3, 2 * 4) do not.
CRASHING_ADD = '''\
def add(a, b):
    """Return a + b (exits the whole process on negative input)."""
    import os
    if a < 0:
        os._exit(0)
    return a + b
'''
HANGING_SCALE = '''\
class Box:
    def scale(self, x):
        """Twice x (a busy loop for large x)."""
        while x > 5:
            pass
        return 2 * x
'''
HIDDEN = '''\
import pytest
from hypothesis import given, strategies as st

from minidist.toy import Box, add


@pytest.mark.exercise("toy_add")
@given(st.integers(-5, 5))
def test_add_any(a):
    assert add(a, 1) == a + 1


@pytest.mark.exercise("toy_scale")
@given(st.integers(0, 10))
def test_scale_any(x):
    assert Box().scale(x) == 2 * x
'''


@pytest.mark.slow
def test_a_hang_inside_hypothesis_and_an_os_exit_cost_only_their_own_tests(toy_repo, tmp_path):  # noqa: F811
    student = tmp_path / "student"
    make_student_copy(toy_repo, student)
    toy = student / "minidist" / "toy.py"
    text = splice_functions(toy.read_text(), CRASHING_ADD, {"add"})
    toy.write_text(splice_functions(text, HANGING_SCALE, {"Box.scale"}))
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "test_hidden_toy.py").write_text(HIDDEN)
    start = time.monotonic()
    report = grade_submission(student, toy_repo, hidden=hidden, timeout=4.0)
    assert time.monotonic() - start < 90
    by_id = {r.exercise: r for r in report.exercises}
    # Each exercise keeps its public test: the hidden one that crashed or hung was resumed past.
    assert {ex: (r.passed, r.total) for ex, r in by_id.items()} == {"toy_add": (1, 2), "toy_scale": (1, 2)}
    assert sorted((i["exercise"], i["test"].split("::")[1], i["outcome"]) for i in report.incidents) == [
        ("toy_add", "test_add_any", "crashed"), ("toy_scale", "test_scale_any", "hung")]
    assert "exit status 0" in by_id["toy_add"].failing[0]["message"]
    assert report.status == "incomplete"
    assert "crashed in toy_add" in format_text(report) and "hung in toy_scale" in format_text(report)


def test_a_directory_that_is_not_a_copy_is_refused_at_once(toy_repo, tmp_path):  # noqa: F811
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "essay.txt").write_text("not code")
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"not a copy of the course: a copy .* minidist/toy.py"):
        grade_submission(tmp_path / "notes", toy_repo)
    assert time.monotonic() - start < 30
    if MADE_BY_THE_TOOLING:     # a student copy's own CLI refuses to grade at all (checked elsewhere)
        return
    done = subprocess.run([sys.executable, "-m", "minidist", "exercises", "grade", str(tmp_path / "notes")],
                          capture_output=True, text=True, env=dict(os.environ, MPLBACKEND="Agg"), check=False)
    assert time.monotonic() - start < 30
    assert done.returncode == 2 and "is not a copy of the course" in done.stderr, done.stderr


def test_feedback_is_at_most_40_lines_real_failures_first_and_has_no_raw_bytes():
    from minidist_course import ExerciseResult, SubmissionReport
    from minidist_course.pytest_report import RAW_BYTES
    from minidist_course.results import environment

    wrong = [{"test": f"tests/t.py::test_{i}", "outcome": "failed",
              "message": "AssertionError: rank 1: 3 of 8 elements wrong; element 4 (chunk 1 of 2)"}
             for i in range(50)]
    cut = [{"test": f"tests/t.py::test_l{i}", "outcome": "failed",
            "message": "NotImplementedError: exercise linear: see lessons/01_backprop.py"} for i in range(40)]
    torch_skip = "could not import 'torch': No module named 'torch'"
    exercises = [ExerciseResult("linear", 0, 40, 0.0, failing=cut),
                 ExerciseResult("adam", 0, 3, 0.0, "minidist/optim/adam.py: invalid syntax (line 9)",
                                failing=cut[:3]),
                 ExerciseResult("ring_allreduce", 0, 50, 0.0, failing=wrong),
                 ExerciseResult("softmax_backward", 3, 3, 1.0, skipped=2, skip_reasons=[torch_skip])]
    exercises += [ExerciseResult(f"ex{i}", 1, 2, 0.5, skipped=1, skip_reasons=[torch_skip], failing=[
        {"test": f"tests/t.py::test_x{i}", "outcome": "not run", "message": "the time limit was reached"}])
        for i in range(60)]
    md = format_markdown(SubmissionReport("ada", "graded", 1.0, environment(2), exercises))
    lines = md.splitlines()
    assert len(lines) <= 40, md
    assert sum("skipped" in line for line in lines) == 1 and "torch is not installed" in md
    assert 'pip install -e ".[oracle]"' in md
    assert "Not solved yet (1: every test stops at the exercise's NotImplementedError): `linear`." in lines
    assert "Full marks (1): `softmax_backward`." in lines
    rows = [line for line in lines if line.startswith("| `")]
    assert rows[0] == ("| `adam` | 0/3 | 0.00 | code not taken: minidist/optim/adam.py: invalid syntax "
                       "(line 9) |")
    assert rows[1].startswith("| `ring_allreduce` | 0/50 | 0.00 | `test_0` failed: AssertionError: rank 1")
    assert "not run: not run" not in md and lines[-1].startswith("(… ")
    assert RAW_BYTES.sub("<raw bytes>", "assert b'\\x00\\x01' == b\"ab\" (tab's)") == (
        "assert <raw bytes> == <raw bytes> (tab's)")
