"""Shared test set-up: hypothesis profiles, the `exercise` mark and the `--exercise ID` option.

Profiles (choose with HYPOTHESIS_PROFILE=...): "default" keeps the whole suite within minutes on a
2-core machine; "thorough" runs many more examples. Neither has a deadline: processes outnumber cores
in the cluster tests, so timings are noisy by design.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("MPLBACKEND", "Agg")

settings.register_profile("default", max_examples=20, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_addoption(parser):
    parser.addoption("--exercise", action="append", default=[], metavar="ID",
                     help="run only the tests of exercise ID (repeatable); see lessons/EXERCISES.md")


def pytest_collection_modifyitems(config, items):
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
