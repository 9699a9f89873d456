"""Each exercise checkable on its own: CI's proof that a student can solve them one at a time.

For every exercise X: a student copy with only X solved (``make --keep X``: every other exercise cut)
must pass all of X's own tests (``pytest --exercise X``: the tests that reach X alone). An exercise
without own tests is an error — nothing could check it alone, and it could not be graded. Copies are
checked ``jobs`` at a time, each pytest in its own process group (runner.py).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from minidist.nn.checks import check_count, check_real

from .markers import all_regions
from .own_tests import own_tests
from .runner import run_watched
from .student_copy import make_student_copy


@dataclass
class AloneResult:
    exercise: str
    own_tests: int
    ok: bool
    seconds: float
    detail: str


def check_alone(root: Path, exercise: str, tests: list[str], limit: float) -> AloneResult:
    if not tests:
        return AloneResult(exercise, 0, False, 0.0, "no own test: add a test that reaches only this "
                                                    "exercise, then run `python -m minidist exercises map`")
    with tempfile.TemporaryDirectory(prefix=f"minidist-alone-{exercise}-") as tmp:
        copy = Path(tmp) / "repo"
        make_student_copy(root, copy, keep=[exercise])
        files = sorted({t.split("::")[0] for t in tests})
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--exercise", exercise, *files]
        env = dict(os.environ, PYTHONPATH=str(copy), MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1",
                   MINIDIST_ALL_TESTS="1")   # every test, not a student's quick run (tests/student_mode.py)
        out = run_watched(cmd, copy, env, Path(tmp) / "pytest.log", limit)
    summary = (out.log_tail.strip().splitlines() or ["(no output)"])[-1]
    ok = out.returncode == 0
    if ok:
        detail = summary
    else:
        detail = f"timed out after {limit:.0f} s" if out.timed_out else out.log_tail[-1500:]
    return AloneResult(exercise, len(tests), ok, round(out.seconds, 1), detail)


def check_each_alone(root: Path, exercises: list[str] | None = None, jobs: int = 2,
                     limit: float = 900.0, echo=print) -> list[AloneResult]:
    """Run check_alone for every exercise (or the given ones), ``jobs`` at a time; echo each result."""
    jobs, limit = check_count(jobs, "jobs"), check_real(limit, "limit", 0, strict=True)
    if exercises is not None and not exercises:
        raise ValueError("exercises=[]: expected the ids of the exercises to check (None: all of them)")
    root = Path(root).resolve()
    ids = exercises or sorted({r.exercise for r in all_regions(root)})
    tests = own_tests(root)
    start = time.monotonic()

    def one(ex: str) -> AloneResult:
        result = check_alone(root, ex, tests.get(ex, []), limit)
        mark = "ok  " if result.ok else "FAIL"
        echo(f"{mark} {ex:28s} {result.own_tests:3d} own tests  {result.seconds:6.1f} s  "
             f"{result.detail if result.ok else ''}".rstrip())
        if not result.ok:
            echo("     " + result.detail.replace("\n", "\n     "))
        return result

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(one, ids))
    bad = [r.exercise for r in results if not r.ok]
    echo(f"{len(ids) - len(bad)}/{len(ids)} exercises pass their own tests alone; "
         f"{time.monotonic() - start:.0f} s in total ({jobs} at a time)"
         + (f"; FAILED: {', '.join(bad)}" if bad else ""))
    return results
