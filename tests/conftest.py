"""Shared test set-up: hypothesis profiles, the `exercise` marks and the `--exercise ID` option.

Exercise marks come from tests/exercise_map.json, which `python -m minidist exercises map` measures (which
test reaches which solution region); a test may also carry `@pytest.mark.exercise("id")` itself.
A test that reaches one exercise is that exercise's own test; one that reaches several is an integration
test and carries all their marks. `--exercise X` (repeatable) selects a test when every exercise it
reaches is among those named: `--exercise ring_allreduce` runs ring's own tests, adding
`--exercise linear` also the tests that reach both. `--expect-exercises-cut` is CI's check on a student
copy: a test that reaches a cut exercise must fail there (strict xfail), every other test must pass.
Under `--exercise`, tests needing an extra the exercise does not need (minidist_course/own_tests.py, the
count `exercises list` and the grade share) are left out, files holding none of the selection are not
collected, `@pytest.mark.diagnose` checks run first, and a student's run is quick (tests/student_mode.py).

Profiles (choose with HYPOTHESIS_PROFILE=...): "default" keeps the whole suite within minutes on a
2-core machine; "thorough" runs many more examples; "grading" (the grader's) few examples, derandomized,
and no shrinking: a failing example is reported as found; "student" (a student's `--exercise` run,
tests/student_mode.py) fewer still. Neither has a deadline: processes outnumber cores
in the cluster tests, so timings are noisy by design.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings

from tests import student_mode

os.environ.setdefault("MPLBACKEND", "Agg")

settings.register_profile("default", max_examples=20, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("student", max_examples=5, deadline=None, derandomize=True, database=None,
                          phases=[Phase.explicit, Phase.generate],
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("grading", max_examples=8, deadline=None, derandomize=True, database=None,
                          phases=[Phase.explicit, Phase.generate],
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


ROOT = Path(__file__).resolve().parent.parent
EXERCISE_MAP = ROOT / "tests" / "exercise_map.json"
# Tests that pass on a trivially wrong stand-in of the one exercise they reach (minidist_course/
# standins.py): they do not test it, so `--exercise` (and the grade) leaves them out.
STANDIN_PASSES = Path(__file__).resolve().parent / "exercise_standins.json"
STUDENT_STAMP = Path(__file__).resolve().parent.parent / ".minidist-student.json"


def pytest_addoption(parser):
    parser.addoption("--exercise", action="append", default=[], metavar="ID",
                     help="run only the tests of exercise ID (repeatable); see lessons/EXERCISES.md")
    parser.addoption("--expect-exercises-cut", action="store_true",
                     help="student-copy check: every test that reaches an exercise must fail")


def exercises_of(item) -> set[str]:
    return {m.args[0] for m in item.iter_markers("exercise") if m.args}


def _exercise_map() -> dict:
    global _MAP
    if _MAP is None:
        _MAP = json.loads(EXERCISE_MAP.read_text()) if EXERCISE_MAP.exists() else {}
    return _MAP


_MAP = None


def pytest_collection_modifyitems(config, items):
    mapping = _exercise_map()
    for item in items:
        for exercise in mapping.get(item.nodeid, []):
            item.add_marker(pytest.mark.exercise(exercise))
    if config.getoption("--expect-exercises-cut"):
        # A copy made with --only/--keep says which exercises it cut; without the stamp, all were.
        cut = set(json.loads(STUDENT_STAMP.read_text())["cut"]) if STUDENT_STAMP.exists() else None
        for item in items:
            reached = exercises_of(item)
            if reached and (cut is None or reached & cut):
                item.add_marker(pytest.mark.xfail(strict=True, reason="an exercise it reaches is cut"))
    wanted = set(config.getoption("--exercise"))
    if not wanted:
        return
    selected, deselected = exercise_selection(items, wanted)
    config.hook.pytest_deselected(items=deselected)
    items[:] = selected


def exercise_selection(items, wanted: set[str]) -> tuple[list, list]:
    """(selected, deselected): the tests `--exercise` runs for the exercises named, diagnosing checks
    first. Counted by the rule `exercises list` and the grade use (minidist_course/own_tests.py)."""
    try:
        from minidist_course.own_tests import counts_here
    except ImportError:      # a toy course (the tooling tests' own) without the rule: no test needs an extra
        def counts_here(root, test_id):
            return True

    weak = {}
    if STANDIN_PASSES.exists() and not os.environ.get("MINIDIST_ALL_REACHING_TESTS"):
        weak = {(ex, test) for ex, tests in json.loads(STANDIN_PASSES.read_text()).items() for test in tests}
    selected, deselected = [], []
    for item in items:
        reached = exercises_of(item)
        passes_a_standin = len(reached) == 1 and (next(iter(reached)), item.nodeid) in weak
        chosen = reached and reached <= wanted and not passes_a_standin and counts_here(ROOT, item.nodeid)
        (selected if chosen else deselected).append(item)
    selected.sort(key=lambda item: not item.get_closest_marker("diagnose"))
    return selected, deselected


def pytest_configure(config):
    student_mode.configure(config)


def pytest_runtest_setup(item):
    student_mode.setup(item)


def pytest_runtest_logreport(report):
    student_mode.logreport(report)


def pytest_ignore_collect(collection_path, config):
    """Under --exercise, skip the test files that hold none of the named exercises' tests (a file's
    module-level skip, e.g. pyarrow's, must not show among an exercise's results)."""
    wanted = set(config.getoption("--exercise"))
    if not wanted or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    rel = collection_path.resolve().relative_to(ROOT).as_posix() if collection_path.is_relative_to(ROOT) \
        else None
    if rel is None or "mark.exercise(" in collection_path.read_text():
        return None
    return not any(test.startswith(rel + "::") and set(ids) <= wanted
                   for test, ids in _exercise_map().items())


@pytest.fixture(scope="session", autouse=True)
def one_blas_thread():
    """The tests multiply small matrices: one BLAS thread is fastest for them, and on a machine shared
    by several processes (cluster ranks, other jobs) BLAS threads waiting on each other make them many
    times slower. Cluster workers limit themselves the same way (minidist/cluster/launcher.py)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_terminal_summary(terminalreporter):
    """Skips summed up by reason, one line each ("38 skipped: could not import 'torch'"): pyproject's
    `-rfE` lists failures and errors one by one, but forty skips for one missing oracle say one thing."""
    from collections import Counter

    reasons = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.write_sep("=", "skips by reason")
        for reason, count in reasons.most_common():
            terminalreporter.write_line(f"{count} skipped: {reason}")
