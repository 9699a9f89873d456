"""From tests' outcomes to scores: per exercise, per integration group.

A test that reaches one exercise counts in that exercise's score; skips are counted apart and weigh
nothing. An exercise that makes one promise (its values) scores the fraction of its tests that pass. One
whose statement makes several (registry.py: values for every op, messages and bytes, …, each with its
weight) scores the weights of the promises *kept*: a promise is kept when every test of it that ran
passed (a test names its promise with ``@pytest.mark.promise(name)``; unmarked, it checks "values"), so
a solution that breaks one promise loses that promise's share, however few tests check it.
A test that reaches several is an integration test: it is reported on a line
of its own ("linear + megatron_mlp: 3/4"), never in an exercise's score, so the grade of one exercise
never depends on another. A test killed by the per-test timeout is "hung", one whose process ended
under it "crashed", one never started "not run" (sessions.py); all count as failed.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from dataclasses import dataclass, field

FAILED = ("failed", "hung", "crashed", "not run")


@dataclass
class TestResult:
    id: str
    exercises: list[str]
    outcome: str        # passed | failed | skipped | hung | crashed | not run
    message: str = ""
    seconds: float = 0.0
    promise: str = "values"


@dataclass
class ExerciseResult:
    exercise: str
    passed: int
    total: int          # own tests run (skips excluded)
    score: float
    error: str | None = None
    skipped: int = 0
    failing: list[dict] = field(default_factory=list)    # [{"test": id, "outcome": ..., "message": ...}]
    skip_reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0
    promises: dict[str, list] = field(default_factory=dict)   # {promise: [passed, run, weight, kept]}

    def broken_promises(self) -> list[str]:
        """The promises some test of which ran and failed (each lost its share of the score)."""
        return [name for name, (_passed, run, _weight, kept) in self.promises.items() if run and not kept]


@dataclass
class IntegrationResult:
    exercises: list[str]
    passed: int
    total: int
    skipped: int = 0
    failing: list[dict] = field(default_factory=list)

    @property
    def name(self) -> str:
        return " + ".join(self.exercises)


def _failure(t: TestResult) -> dict:
    return {"test": t.id, "outcome": t.outcome, "message": t.message}


def promise_score(run: list[TestResult], weights: dict[str, float]) -> tuple[float, dict[str, list]]:
    """(score, {promise: [passed, run, weight, kept]}) of an exercise's tests that ran (skips excluded).

    One promise (or none declared): the fraction passed. Several: the kept promises' weights over the
    weights of the promises that had a test run (a test of an undeclared promise counts for "values")."""
    passed = sum(t.outcome == "passed" for t in run)
    if len(weights) < 2:
        return (round(passed / len(run), 4) if run else 0.0), {}
    table: dict[str, list] = {}
    for name, weight in weights.items():
        mine = [t for t in run if (t.promise if t.promise in weights else "values") == name]
        good = sum(t.outcome == "passed" for t in mine)
        table[name] = [good, len(mine), weight, bool(mine) and good == len(mine)]
    tried = sum(w for _p, n, w, _k in table.values() if n)
    kept = sum(w for _p, _n, w, k in table.values() if k)
    return (round(kept / tried, 4) if tried else 0.0), table


def score_exercises(tests: list[TestResult], exercises: list[str], errors: dict[str, str],
                    promises: dict[str, dict[str, float]] | None = None
                    ) -> tuple[list[ExerciseResult], list[IntegrationResult]]:
    """Own tests scored per exercise (``promises``: {exercise: {promise: weight}}, from the registry);
    integration tests grouped by the exercises they reach."""
    scored = []
    for ex in exercises:
        own = [t for t in tests if t.exercises == [ex]]
        run = [t for t in own if t.outcome != "skipped"]
        passed = sum(t.outcome == "passed" for t in run)
        error = errors.get(ex)
        if not own and error is None:
            error = "no own test: no test reaches this exercise alone"
        elif not run and error is None:
            error = "every own test was skipped (see the environment)"
        score, table = promise_score(run, (promises or {}).get(ex, {}))
        scored.append(ExerciseResult(
            ex, passed, len(run), score, error,
            skipped=len(own) - len(run), failing=[_failure(t) for t in run if t.outcome in FAILED],
            skip_reasons=sorted({t.message for t in own if t.outcome == "skipped"}), promises=table))
    groups: dict[tuple[str, ...], list[TestResult]] = {}
    for t in tests:
        if len(t.exercises) > 1:
            groups.setdefault(tuple(t.exercises), []).append(t)
    integration = []
    for ids, group in sorted(groups.items()):
        run = [t for t in group if t.outcome != "skipped"]
        integration.append(IntegrationResult(list(ids), sum(t.outcome == "passed" for t in run), len(run),
                                             len(group) - len(run),
                                             [_failure(t) for t in run if t.outcome in FAILED]))
    return scored, integration


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(workers: int) -> dict:
    """What the grade ran on: the oracles decide which tests run (torch, ml_dtypes) or are skipped."""
    env = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
           "workers": workers, "hypothesis_profile": "grading"}
    for name in ("numpy", "torch", "ml_dtypes", "hypothesis", "pytest", "pytest-xdist", "pytest-timeout"):
        env[name] = _version(name) or "absent"
    return env
