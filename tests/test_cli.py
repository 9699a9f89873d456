"""python -m minidist: a bad count or time (--mpi, --jobs, --timeout, --limit) is a one-line usage error that
names the option (exit status 2), never a traceback, a silent run or a value quietly replaced."""

import math
import re
from pathlib import Path

import pytest

import minidist.__main__ as cli
from minidist.checks import count_option, seconds_option
from minidist.exercises import grade_class
from minidist.exercises.isolation import check_each_alone
from minidist.exercises.standins import grade_standins

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
        monkeypatch.setattr(f"minidist.exercises.cli.{name}", must_not_run)
    monkeypatch.setattr("minidist.exercises.standins.grade_standins", must_not_run)
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
