"""Grade a student's copy with the reference tests, one exercise at a time.

For each exercise the grader builds a fresh reference tree, puts the *student's* version of every function
that holds that exercise's regions into it (the rest stays the reference solution, so a mistake in one
exercise never costs marks in another), adds the instructor's hidden tests if any, and runs the tests
that reach the exercise (``pytest --exercise ID``) with a per-test timeout — a student's deadlock fails
its test instead of hanging the grader. Score = tests passed / tests run (skips excluded).

Hidden tests are ordinary pytest files that carry ``@pytest.mark.exercise("<id>")`` themselves.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

from .markers import all_regions, function_spans
from .student_copy import _copy_tree


@dataclass
class ExerciseResult:
    exercise: str
    passed: int
    total: int
    score: float
    error: str | None = None


def splice_functions(reference: str, student: str, names: set[str]) -> str:
    """The reference file with the named functions replaced by the student's versions of them."""
    ref_spans, stu_spans = function_spans(reference), function_spans(student)
    missing = sorted(names - set(stu_spans))
    if missing:
        raise ValueError(f"the submission lacks function(s) {missing}")
    ref_lines, stu_lines = reference.splitlines(keepends=True), student.splitlines(keepends=True)
    # Bottom up, so earlier line numbers stay valid. Named functions never nest (one exercise each).
    for name in sorted(names, key=lambda n: ref_spans[n][0], reverse=True):
        (r0, r1), (s0, s1) = ref_spans[name], stu_spans[name]
        ref_lines[r0 - 1:r1] = stu_lines[s0 - 1:s1]
    return "".join(ref_lines)


def _count_junit(report: Path) -> tuple[int, int]:
    passed = total = 0
    for case in ET.parse(report).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        if "skipped" in kinds:
            continue
        total += 1
        passed += not ({"failure", "error"} & kinds)
    return passed, total


def grade_exercise(submission: Path, root: Path, exercise: str, hidden: Path | None = None,
                   timeout: float = 120.0, tests: list[str] | None = None) -> ExerciseResult:
    regions = [r for r in all_regions(root) if r.exercise == exercise]
    if not regions:
        raise ValueError(f"unknown exercise {exercise!r}")
    with tempfile.TemporaryDirectory(prefix=f"minidist-grade-{exercise}-") as tmp:
        tree = Path(tmp) / "repo"
        _copy_tree(root, tree)
        try:
            for path in sorted({r.path for r in regions}):
                names = {r.function for r in regions if r.path == path}
                student_file = submission / path
                if not student_file.exists():
                    raise ValueError(f"the submission has no {path}")
                text = splice_functions((root / path).read_text(), student_file.read_text(), names)
                (tree / path).write_text(text)
        except (ValueError, SyntaxError) as err:
            return ExerciseResult(exercise, 0, 0, 0.0, error=str(err))
        if hidden is not None:
            shutil.copytree(hidden, tree / "tests" / "hidden")
            (tree / "tests" / "hidden" / "__init__.py").touch()
        report = Path(tmp) / "report.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--exercise", exercise,
               f"--timeout={timeout}", f"--junitxml={report}", *(tests or [])]
        done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=False,
                              env=_env_for(tree))
        if not report.exists():
            return ExerciseResult(exercise, 0, 0, 0.0, error=f"pytest did not run:\n{done.stdout[-2000:]}"
                                                             f"{done.stderr[-2000:]}")
        passed, total = _count_junit(report)
    score = passed / total if total else 0.0
    return ExerciseResult(exercise, passed, total, round(score, 4),
                          error=None if total else "no test ran for this exercise")


def _env_for(tree: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(tree), MPLBACKEND="Agg")


def grade(submission: Path, root: Path, exercises: list[str] | None = None, hidden: Path | None = None,
          timeout: float = 120.0, tests: list[str] | None = None) -> list[ExerciseResult]:
    """Grade every exercise (or the given ones) of ``submission`` against the reference at ``root``.

    ``tests`` (paths relative to the repository, e.g. ["tests/collectives"]) limits each run to those
    test files or folders — a quicker, narrower grade; by default every test that reaches the exercise.
    """
    submission, root = Path(submission).resolve(), Path(root).resolve()
    if not submission.is_dir():
        raise ValueError(f"submission {submission} is not a directory")
    ids = exercises or sorted({r.exercise for r in all_regions(root)})
    return [grade_exercise(submission, root, ex, hidden, timeout, tests) for ex in ids]


def as_json_ready(results: list[ExerciseResult]) -> dict:
    return {"exercises": [asdict(r) for r in results],
            "total_score": round(sum(r.score for r in results) / len(results), 4) if results else 0.0}
