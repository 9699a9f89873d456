"""Run one exercise's tests so that nothing can stall or spoil them: pytest watched from outside.

pytest runs in its own process group (with everything its tests start: cluster ranks, strays) and writes
what happens to a report file as it happens (pytest_report.py). This process reads that file while
pytest runs and enforces the limits itself, from outside, with SIGKILL to the whole group — so a limit
always fires, whatever the test does (a busy loop, a hang inside hypothesis, a blocked system call):

* a test that runs longer than ``per_test`` seconds is killed and counted **hung**;
* a session that ends while a test runs (``os._exit``, a signal, a crash of the interpreter) leaves that
  test **crashed**;
* either way a new session resumes with the tests not yet run, so one bad test costs only itself;
* after ``max_incidents`` hung or crashed tests, or ``limit`` seconds in all, the tests left are
  **not run** (the student's code is clearly stuck; the exercise's grade says so).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .results import TestResult
from .runner import run_in_group

POLL_SECONDS = 0.25


@dataclass
class SessionOutcome:
    tests: list[TestResult]
    seconds: float
    error: str = ""           # pytest could not collect (the log's end): nothing ran
    incidents: list[str] = field(default_factory=list)   # "hung: test id" / "crashed: test id"


class _Report:
    """Reads a growing report file: collected tests, the one running now, final outcomes."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0
        self.collected: dict[str, list[str]] = {}
        self.promises: dict[str, str] = {}
        self.collection_done = False
        self.results: dict[str, TestResult] = {}
        self.running: str | None = None
        self.running_since = 0.0

    def read(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]         # a line cut short is read next time
        self.offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "collected" in entry:
                self.collected.update(entry["collected"])
                self.promises.update(entry.get("promises", {}))
                self.collection_done = True
            elif "start" in entry:
                self.running, self.running_since = entry["start"], time.monotonic()
            elif "finish" in entry:
                self.running = None
            else:
                self._result(entry)

    def _result(self, entry: dict) -> None:
        test_id, outcome, message = entry["id"], entry["outcome"], entry.get("message", "")
        if outcome == "failed" and entry["when"] != "call":
            message = f"error in {entry['when']}: {message}"
        old = self.results.get(test_id)
        rank = {"passed": 0, "skipped": 1, "failed": 2}
        if old is None or rank[outcome] > rank[old.outcome]:
            self.results[test_id] = TestResult(test_id, [], outcome, message, entry.get("seconds", 0.0))


def run_session(base_cmd: list[str], paths: list[str], cwd: Path, env: dict[str, str], work: Path,
                per_test: float, limit: float, max_incidents: int = 2) -> SessionOutcome:
    """Run ``base_cmd + paths`` (pytest with the report plugin), resuming after hangs and crashes.

    base_cmd must load pytest_report.py and hold the selecting options (``--exercise X``); paths are test
    files or ids. ``work`` is a scratch directory for the report and log files. Returns every selected
    test with its outcome (the first collection defines the set; a resumed session names the tests left).
    """
    start = time.monotonic()
    collected: dict[str, list[str]] = {}
    promises: dict[str, str] = {}
    final: dict[str, TestResult] = {}
    incidents: list[str] = []
    args, attempt, stop_reason = list(paths), 0, ""
    while True:
        report = _Report(work / f"report-{attempt}.jsonl")
        log = work / f"pytest-{attempt}.log"
        cmd_env = dict(env, MINIDIST_GRADE_REPORT=str(report.path))
        proc, stopped = run_in_group(base_cmd + args, cwd, cmd_env, log, POLL_SECONDS,
                                     _limits(report, per_test, start + limit))
        report.read()
        collected.update(report.collected)
        promises.update(report.promises)
        final.update(report.results)
        if attempt == 0 and not report.collection_done:
            return SessionOutcome([], time.monotonic() - start, error=_tail(log))
        running = report.running
        if running is not None:
            if stopped:
                kind, why = "hung", stopped
            else:
                kind, why = "crashed", (f"the test process ended while this test ran (exit status "
                                        f"{proc.returncode}): os._exit, a signal or a crash in the code")
            final[running] = TestResult(running, [], kind, why)
            incidents.append(f"{kind}: {running}")
        left = [t for t in collected if t not in final]
        if not left or running is None:
            if left and not stopped:
                stop_reason = f"pytest ended before this test started (exit status {proc.returncode})"
            elif left:
                stop_reason = stopped
            break
        if len(incidents) >= max_incidents:
            stop_reason = f"{len(incidents)} tests of this exercise hung or crashed before it"
            break
        if time.monotonic() - start >= limit:
            stop_reason = f"the exercise's time limit ({limit:.0f} s) was reached"
            break
        args, attempt = left, attempt + 1
    tests = []
    for test_id, exercises in collected.items():     # run order: the diagnosing checks come first
        result = final.get(test_id) or TestResult(test_id, [], "not run", stop_reason)
        result.exercises = exercises
        result.promise = promises.get(test_id, "values")
        tests.append(result)
    return SessionOutcome(tests, time.monotonic() - start, incidents=incidents)


def _limits(report: _Report, per_test: float, deadline: float) -> Callable[[], str]:
    """The check run_in_group makes while pytest runs: why to kill it now ("" while all is well)."""
    def check() -> str:
        report.read()
        now = time.monotonic()
        if report.running is not None and now - report.running_since > per_test:
            return f"still running after {per_test:.0f} s (the per-test timeout): killed"
        if now > deadline:
            return "still running when the exercise's time limit was reached: killed"
        return ""
    return check


def _tail(log: Path, lines: int = 25) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def pytest_command(python: str, plugin: str) -> list[str]:
    """pytest with the report plugin, no cache, no xdist, and no pytest-timeout (the watcher times)."""
    off = ["--timeout=0"] if importlib.util.find_spec("pytest_timeout") else []
    return [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", plugin, *off]


def grading_env(tree: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(tree), MPLBACKEND="Agg", HYPOTHESIS_PROFILE="grading",
                PYTHONDONTWRITEBYTECODE="1")
