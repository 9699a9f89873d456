"""python -m minidist: a bad count or time (--mpi, --jobs, --timeout, --limit) is a one-line usage error that
names the option (exit status 2), never a traceback, a silent run or a value quietly replaced."""

import math
import re
from pathlib import Path

import pytest

import minidist.__main__ as cli
from minidist.nn.checks import count_option, seconds_option
from minidist_course import grade_class
from minidist_course.isolation import check_each_alone
from minidist_course.standins import grade_standins
from tests.test_exercises_grading import MADE_BY_THE_TOOLING

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("count", ["-2", "0", "two", "1.5"])
def test_run_refuses_a_bad_mpi_process_count(count, capsys, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the lesson (or mpiexec) was started")

    monkeypatch.setattr(cli.runpy, "run_path", must_not_run)
    monkeypatch.setattr("minidist.cluster.mpi_launch.launch", must_not_run)
    with pytest.raises(SystemExit) as stop:
        cli.main(["run", "05", "--mpi", count])
    assert stop.value.code == 2
    assert f"the number of MPI processes must be an integer >= 1, got '{count}'" in capsys.readouterr().err


EXERCISE_OPTIONS = [
    (["grade", "SUB"], "--jobs", "expected an integer >= 1"),
    (["check"], "--jobs", "expected an integer >= 1"),
    (["standins"], "--jobs", "expected an integer >= 1"),
    (["grade", "SUB"], "--timeout", "expected a finite number of seconds > 0"),
    (["grade", "SUB"], "--limit", "expected a finite number of seconds > 0"),
    (["check"], "--limit", "expected a finite number of seconds > 0"),
]
BAD_VALUES = {"expected an integer >= 1": ["0", "-2", "1.5", "nan", "True", ""],
              "expected a finite number of seconds > 0": ["0", "-1", "nan", "inf", "-inf", "True", ""]}


@pytest.mark.parametrize("verb, option, expected", EXERCISE_OPTIONS)
def test_exercises_options_refuse_bad_sizes_naming_the_option(verb, option, expected, capsys, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the command ran with a bad option")

    for name in ("grade_class", "check_each_alone"):
        monkeypatch.setattr(f"minidist_course.cli.{name}", must_not_run)
    monkeypatch.setattr("minidist_course.standins.grade_standins", must_not_run)
    for bad in BAD_VALUES[expected]:
        with pytest.raises(SystemExit) as stop:
            cli.main(["exercises", *verb, f"{option}={bad}"])
        assert stop.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines[-1].endswith(f"error: argument {option}: {expected}, got {bad!r}"), lines



def test_option_types_take_good_values():
    assert [count_option(1)(t) for t in ("1", "3", " 8 ")] == [1, 3, 8]
    assert count_option(0)("0") == 0
    assert [seconds_option(t) for t in ("2.5", "1e3", "30")] == [2.5, 1000.0, 30.0]


@pytest.mark.parametrize("call, message", [
    (lambda: grade_class([ROOT / "nowhere"], ROOT, jobs=0), "jobs must be an integer >= 1, got 0"),
    (lambda: grade_class([ROOT / "nowhere"], ROOT, jobs=True), "a bool is not a count"),
    (lambda: grade_class([ROOT / "nowhere"], ROOT, timeout=math.nan), "timeout must be a finite number > 0"),
    (lambda: grade_class([ROOT / "nowhere"], ROOT, limit=-1.0), "limit must be a finite number > 0"),
    (lambda: check_each_alone(ROOT, jobs=-2), "jobs must be an integer >= 1, got -2"),
    (lambda: check_each_alone(ROOT, limit=math.inf), "limit must be a finite number > 0, got inf"),
    (lambda: grade_standins(ROOT, jobs=2.0), "jobs must be an integer >= 1, got 2.0"),
    (lambda: grade_standins(ROOT, timeout=0), "timeout must be a finite number > 0, got 0.0"),
])
def test_the_functions_behind_the_options_refuse_the_same_values(call, message):
    """Called from Python, the grader's functions refuse what the options refuse, before any work (the
    submission "nowhere" does not exist: it is never looked at)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


@pytest.mark.parametrize("bad", ["0", "-1", "1.5", "nan"])
def test_plan_refuses_a_table_of_no_rows(bad, capsys):
    """--top is how many rows of the plan to print: fewer than one is a usage error, not an empty table."""
    with pytest.raises(SystemExit) as stop:
        cli.main(["plan", "--layers", "4", "--d-model", "64", "--heads", "4", "--seq", "32", "--batch", "8",
                  "--devices", "4", f"--top={bad}"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"argument --top: expected an integer >= 1, got {bad!r}")


def test_a_listing_cut_short_by_its_reader_ends_quietly():
    """``exercises list | head``: the reader goes away before the listing is written; no traceback."""
    import os
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "minidist", "exercises", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    proc.stdout.close()                       # before the command has written anything
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def _grade_must_not_run(*args, **kwargs):
    raise AssertionError("grading started before the outputs were checked")


@pytest.mark.skipif(MADE_BY_THE_TOOLING, reason="a student or instrumented copy does not grade at all")
@pytest.mark.parametrize("case", ["user file in --out", "--out is a file", "--csv in a missing folder"])
def test_grade_checks_its_outputs_before_grading(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("minidist_course.cli.grade_class", _grade_must_not_run)
    student = tmp_path / "alice"
    out = tmp_path / "feedback"
    if case == "user file in --out":
        out.mkdir()
        (out / "alice.md").write_text("my own notes")
        options = ["--out", str(out)]
    elif case == "--out is a file":
        out.write_text("a file")
        options = ["--out", str(out)]
    else:
        options = ["--csv", str(tmp_path / "missing" / "scores.csv")]
    assert cli.main(["exercises", "grade", str(student), *options]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("exercises grade: "), err
    if case == "user file in --out":
        assert (out / "alice.md").read_text() == "my own notes"


@pytest.mark.skipif(MADE_BY_THE_TOOLING, reason="a student or instrumented copy does not grade at all")
def test_grade_outputs_get_distinct_names_and_replace_only_the_grader_s_files(tmp_path, monkeypatch):
    from minidist_course.grade import SubmissionReport
    from minidist_course.report import check_outputs, student_names
    from minidist_course.results import environment

    subs = [tmp_path / "a" / "alice", tmp_path / "b" / "alice", tmp_path / "bob"]
    assert student_names(subs) == ["a-alice", "b-alice", "bob"]
    assert student_names([tmp_path / "a" / "x", tmp_path / "b" / "a" / "x"]) == ["a-x-1", "a-x-2"]

    def fake_grade(submissions, root, **kwargs):
        return [SubmissionReport(str(s), "graded", 1.0, environment(1), []) for s in submissions]

    monkeypatch.setattr("minidist_course.cli.grade_class", fake_grade)
    out, scores = tmp_path / "fb", tmp_path / "scores.csv"
    args = ["exercises", "grade", *map(str, subs), "--out", str(out), "--csv", str(scores)]
    assert cli.main(args) == 0
    assert sorted(p.name for p in out.glob("*.md")) == ["a-alice.md", "b-alice.md", "bob.md"]
    rows = scores.read_text().splitlines()[1:]
    assert [row.split(",")[0] for row in rows] == ["a-alice", "b-alice", "bob"]
    assert cli.main(args) == 0                                   # its own files: replaced
    (out / "bob.md").write_text("edited by hand")
    with pytest.raises(ValueError, match="was not written by the grader"):
        check_outputs([out / "bob.md"])
    assert cli.main(args) == 2 and (out / "bob.md").read_text() == "edited by hand"


def test_the_grading_bar_is_quiet_when_stdout_is_not_a_terminal(capsys, monkeypatch):
    from minidist_course.cli import Progress

    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    progress = Progress()
    assert progress.bar is None
    progress.update(3, 10)
    progress.echo("[1/2] ada: graded, score 1.00")
    progress.close()
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "[1/2] ada: graded, score 1.00\n"


def test_on_a_terminal_the_bar_counts_the_sessions(monkeypatch):
    pytest.importorskip("tqdm")
    from minidist_course.cli import Progress

    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    progress = Progress()
    progress.update(0, 12)
    progress.update(5, 12)
    assert (progress.bar.n, progress.bar.total) == (5, 12)
    progress.close()
