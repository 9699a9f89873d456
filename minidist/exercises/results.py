"""From the grading session's report file to scores: per test, per exercise, per integration group.

A test that reaches one exercise counts in that exercise's score (passed / run; skips counted apart and
not in the denominator). A test that reaches several is an integration test: it is reported on a line
of its own ("linear + megatron_mlp: 3/4"), never in an exercise's score, so the grade of one exercise
never depends on another. A test that was still running when the time limit passed, or that hit the
per-test timeout, is "hung"; one that never started is "not run"; both count as failed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

FAILED = ("failed", "hung", "not run")


@dataclass
class TestResult:
    id: str
    exercises: list[str]
    outcome: str        # passed | failed | skipped | hung | not run
    message: str = ""
    seconds: float = 0.0


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


def read_report(path: Path, timed_out: bool, limit: float) -> list[TestResult]:
    """Every collected test with its final outcome (the worst of its setup, call and teardown)."""
    collected: dict[str, list[str]] = {}
    started: set[str] = set()
    results: dict[str, TestResult] = {}
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:      # a line cut short by a kill
            continue
        if "collected" in entry:
            collected.update(entry["collected"])
        elif "start" in entry:
            started.add(entry["start"])
        else:
            _merge(results, entry)
    tests = []
    for test_id, exercises in sorted(collected.items()):
        result = results.get(test_id)
        if result is None:
            if test_id in started:
                why = (f"still running when the submission's time limit ({limit:.0f} s) was reached"
                       if timed_out else "pytest stopped while this test ran")
                result = TestResult(test_id, exercises, "hung", why)
            else:
                result = TestResult(test_id, exercises, "not run",
                                    "the session ended before this test started")
        result.exercises = exercises
        tests.append(result)
    return tests


def _merge(results: dict[str, TestResult], entry: dict) -> None:
    test_id, outcome, message = entry["id"], entry["outcome"], entry.get("message", "")
    if outcome == "failed" and "Timeout" in message and "pytest-timeout" in message:
        outcome = "hung"
    if outcome in ("failed", "hung") and entry["when"] != "call":
        message = f"error in {entry['when']}: {message}"
    old = results.get(test_id)
    rank = {"passed": 0, "skipped": 1, "failed": 2, "hung": 3}
    if old is None or rank[outcome] > rank[old.outcome]:
        results[test_id] = TestResult(test_id, [], outcome, message,
                                      entry.get("seconds", 0.0) + (old.seconds if old else 0.0))


def _failure(t: TestResult) -> dict:
    return {"test": t.id, "outcome": t.outcome, "message": t.message}


def score_exercises(tests: list[TestResult], exercises: list[str], errors: dict[str, str]
                    ) -> tuple[list[ExerciseResult], list[IntegrationResult]]:
    """Own tests scored per exercise; integration tests grouped by the exercises they reach."""
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
        scored.append(ExerciseResult(
            ex, passed, len(run), round(passed / len(run), 4) if run else 0.0, error,
            skipped=len(own) - len(run), failing=[_failure(t) for t in run if t.outcome in FAILED],
            skip_reasons=sorted({t.message for t in own if t.outcome == "skipped"})))
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
