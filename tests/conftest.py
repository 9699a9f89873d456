"""Shared test set-up: hypothesis profiles, the `exercise` marks and the `--exercise ID` option.

Exercise marks come from tests/exercise_map.json, which `python -m minidist exercises map` measures (which
test reaches which solution region); a test may also carry `@pytest.mark.exercise("id")` itself.
`--expect-exercises-cut` is CI's check on a student copy: a marked test must fail there (strict xfail),
an unmarked one must pass.

Profiles (choose with HYPOTHESIS_PROFILE=...): "default" keeps the whole suite within minutes on a
2-core machine; "thorough" runs many more examples. Neither has a deadline: processes outnumber cores
in the cluster tests, so timings are noisy by design.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("MPLBACKEND", "Agg")

settings.register_profile("default", max_examples=20, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


EXERCISE_MAP = Path(__file__).resolve().parent / "exercise_map.json"


def pytest_addoption(parser):
    parser.addoption("--exercise", action="append", default=[], metavar="ID",
                     help="run only the tests of exercise ID (repeatable); see lessons/EXERCISES.md")
    parser.addoption("--expect-exercises-cut", action="store_true",
                     help="student-copy check: every test that reaches an exercise must fail")


def pytest_collection_modifyitems(config, items):
    mapping = json.loads(EXERCISE_MAP.read_text()) if EXERCISE_MAP.exists() else {}
    for item in items:
        for exercise in mapping.get(item.nodeid, []):
            item.add_marker(pytest.mark.exercise(exercise))
        if config.getoption("--expect-exercises-cut") and item.get_closest_marker("exercise"):
            item.add_marker(pytest.mark.xfail(strict=True, reason="its exercise is cut in a student copy"))
    wanted = set(config.getoption("--exercise"))
    if not wanted:
        return
    selected, deselected = [], []
    for item in items:
        ids = {m.args[0] for m in item.iter_markers("exercise") if m.args}
        (selected if ids & wanted else deselected).append(item)
    config.hook.pytest_deselected(items=deselected)
    items[:] = selected


@pytest.fixture
def rng():
    return np.random.default_rng(0)
