"""The map from tests to the exercises they reach: tests/exercise_map.json.

``build_map(root)`` makes an instrumented copy of the repository (each solution region records that it was
reached, see hits.py), runs the whole test suite there once, and writes {test id: [exercise ids]} to
tests/exercise_map.json in ``root``. tests/conftest.py turns the map into ``pytest.mark.exercise(id)``
marks, so "every test that reaches a region carries that exercise's mark" is measured, not maintained by
hand. CI checks the map from both sides on a student copy: every marked test must fail there and every
unmarked one pass — a stale map fails that check. Run ``python -m minidist exercises map`` after adding
tests or regions.

A test that reaches exactly one exercise is that exercise's *own* test; one that reaches several is an
*integration* test (``own_exercise``): it carries all their marks, runs under ``pytest --exercise`` only
when all of them are named, and is graded on a line of its own, never in an exercise's score.

Left out: the lesson smoke tests (a lesson that needs an unsolved exercise says so and exits cleanly) and
the exercise tooling's own tests (they run pytest on copies of their own).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .markers import Region, all_regions
from .tree import copy_tree, rewrite_files, solution_lines

HITS_MODULE = "_minidist_exercise_hits"
MAP_PATH = Path("tests") / "exercise_map.json"
STANDINS_PATH = Path("tests") / "exercise_standins.json"    # tests that pass on a stand-in (standins.py)
UNMAPPED_PREFIXES = ("tests/test_lessons.py", "tests/test_exercises_")


def load_map(root: Path) -> dict[str, list[str]]:
    path = Path(root) / MAP_PATH
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def build_map(root: Path, pytest_args: list[str] | None = None) -> dict[str, list[str]]:
    """Run the suite on an instrumented copy; write and return the map."""
    root = Path(root).resolve()
    with tempfile.TemporaryDirectory(prefix="minidist-map-") as tmp:
        copy = Path(tmp) / "repo"
        instrumented_copy(root, copy)
        hits_file = Path(tmp) / "hits.jsonl"
        env = dict(os.environ, MINIDIST_EXERCISE_HITS=str(hits_file), PYTHONPATH=str(copy))
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--ignore",
                "tests/test_lessons.py", "--ignore-glob", "tests/test_exercises_*", *(pytest_args or [])]
        done = subprocess.run(args, cwd=copy, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the instrumented test run failed (exit {done.returncode}); fix the tests "
                               f"before mapping them")
        pairs = ([json.loads(line) for line in hits_file.read_text().splitlines()]
                 if hits_file.exists() else [])
    mapping: dict[str, set[str]] = {}
    for test, exercise in pairs:
        if not test.startswith(UNMAPPED_PREFIXES):
            mapping.setdefault(test, set()).add(exercise)
    result = {test: sorted(ids) for test, ids in sorted(mapping.items())}
    (root / MAP_PATH).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result


def own_exercise(exercises) -> str | None:
    """The exercise a test is about if it reaches exactly one; None for an integration test."""
    ids = set(exercises)
    return next(iter(ids)) if len(ids) == 1 else None


def instrumented_copy(root: Path, dest: Path) -> None:
    """A copy whose regions each record a hit before running their own code (for the coverage map)."""
    root, dest = Path(root).resolve(), Path(dest).resolve()

    def record_then_run(region: Region, lines: list[str]) -> list[str]:
        hit = f"{region.indent}import {HITS_MODULE} as _hits; _hits.record({region.exercise!r})"
        return [hit] + solution_lines(region, lines)

    copy_tree(root, dest)
    # The recorder sits at the copy's root (on PYTHONPATH), independent of the copied package.
    shutil.copy2(Path(__file__).with_name("hits.py"), dest / f"{HITS_MODULE}.py")
    rewrite_files(root, dest, all_regions(root), record_then_run)
