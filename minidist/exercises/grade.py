"""Grade a student's copy with the reference tests: one pytest session per submission.

The grader builds one tree from the reference: every graded exercise's region cut out, then the
*student's* version of each function that holds a region put in (by qualified name; a function the
submission lacks stays cut, and the exercise says why). Everything else — other code, the tests — is
the reference's. It adds the instructor's hidden tests if any, then runs, in a single pytest session
(pytest-xdist workers when installed), every test whose exercises are all graded (``pytest --exercise``
for each), with a per-test timeout, in its own process group under a time limit (runner.py). The
results come from a report file and are attributed by the tests' marks (results.py): an exercise's
score counts its own tests only; integration tests are reported beside it.

Hidden tests are ordinary pytest files that carry ``@pytest.mark.exercise("<id>")`` themselves.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .exercise_map import load_map
from .markers import all_regions, function_spans
from .results import ExerciseResult, IntegrationResult, environment, read_report, score_exercises
from .runner import run_watched
from .student_copy import write_cut_files
from .tree import copy_tree

PLUGIN = "_minidist_grade_report"


@dataclass
class SubmissionReport:
    submission: str
    status: str                    # graded | timeout | error
    seconds: float
    environment: dict
    exercises: list[ExerciseResult]
    integration: list[IntegrationResult] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)
    log_tail: str = ""

    @property
    def total_score(self) -> float:
        return round(sum(r.score for r in self.exercises) / len(self.exercises), 4) if self.exercises else 0.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out["integration"] = [dict(asdict(g), name=g.name) for g in self.integration]
        out["total_score"] = self.total_score
        return out


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


def build_grading_tree(submission: Path, root: Path, tree: Path, exercises: list[str]) -> dict[str, str]:
    """The reference at ``tree`` with the graded exercises' functions taken from the submission.

    Returns {exercise: why its code could not be taken} for the exercises left cut."""
    regions = all_regions(root)
    copy_tree(root, tree)
    write_cut_files(root, tree, regions, exercises)
    errors: dict[str, str] = {}
    for path in sorted({r.path for r in regions if r.exercise in exercises}):
        text, student_file = (tree / path).read_text(), submission / path
        for ex in sorted({r.exercise for r in regions if r.path == path and r.exercise in exercises}):
            names = {r.function for r in regions if r.path == path and r.exercise == ex}
            try:
                if not student_file.exists():
                    raise ValueError(f"the submission has no {path}")
                text = splice_functions(text, student_file.read_text(), names)
            except (ValueError, SyntaxError) as err:
                errors[ex] = f"{path}: {err}"
        (tree / path).write_text(text)
    shutil.copy2(Path(__file__).with_name("pytest_report.py"), tree / f"{PLUGIN}.py")
    return errors


def _test_paths(root: Path, exercises: list[str], tests: list[str] | None, hidden: bool) -> list[str]:
    """The files to collect: those whose mapped tests the selection can reach (collection is not free)."""
    if tests:
        return list(tests)
    files = {test.split("::")[0] for test, ids in load_map(root).items() if set(ids) <= set(exercises)}
    return sorted(files) + (["tests/hidden"] if hidden else [])


def default_workers() -> int:
    return min(2, os.cpu_count() or 1) if importlib.util.find_spec("xdist") else 1


def grade_submission(submission: Path, root: Path, exercises: list[str] | None = None,
                     hidden: Path | None = None, timeout: float = 60.0, tests: list[str] | None = None,
                     limit: float = 600.0, workers: int | None = None, progress=None) -> SubmissionReport:
    """Grade ``submission`` against the reference at ``root``.

    exercises: the ids to grade (default: all); hidden: a directory of extra test files; timeout: seconds
    per test; tests: test paths to limit the run to; limit: seconds for the whole submission;
    workers: pytest-xdist workers (default 2 when installed); progress(done, total, failed, elapsed).
    """
    submission, root = Path(submission).resolve(), Path(root).resolve()
    if not submission.is_dir():
        raise ValueError(f"submission {submission} is not a directory")
    known = sorted({r.exercise for r in all_regions(root)})
    ids = sorted(exercises) if exercises else known
    unknown = sorted(set(ids) - set(known))
    if unknown:
        raise ValueError(f"unknown exercise(s) {unknown}; the library has regions for {known}")
    workers = default_workers() if workers is None else workers
    with tempfile.TemporaryDirectory(prefix="minidist-grade-") as tmp:
        tree, report = Path(tmp) / "repo", Path(tmp) / "report.jsonl"
        errors = build_grading_tree(submission, root, tree, ids)
        if hidden is not None:
            shutil.copytree(hidden, tree / "tests" / "hidden")
            (tree / "tests" / "hidden" / "__init__.py").touch()
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN,
               f"--timeout={timeout}", *(["-n", str(workers)] if workers > 1 else []),
               *[arg for ex in ids for arg in ("--exercise", ex)],
               *_test_paths(root, ids, tests, hidden is not None)]
        env = dict(os.environ, PYTHONPATH=str(tree), MPLBACKEND="Agg", HYPOTHESIS_PROFILE="grading",
                   MINIDIST_GRADE_REPORT=str(report), PYTHONDONTWRITEBYTECODE="1")
        watch = None if progress is None else (lambda elapsed: progress(*_counts(report), elapsed))
        outcome = run_watched(cmd, tree, env, Path(tmp) / "pytest.log", limit, watch)
        results = read_report(report, outcome.timed_out, limit)
    scored, integration = score_exercises(results, ids, errors)
    status = "timeout" if outcome.timed_out else ("graded" if results else "error")
    return SubmissionReport(str(submission), status, round(outcome.seconds, 1), environment(workers), scored,
                            integration, [t.id for t in results if t.outcome == "hung"],
                            "" if results else outcome.log_tail)


def _counts(report: Path) -> tuple[int, int, int]:
    """(finished, collected, failed) so far, from the report file being written."""
    done, failed, collected = set(), set(), set()
    lines = report.read_text(errors="replace").splitlines() if report.exists() else []
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        collected.update(entry.get("collected", {}))
        if "id" in entry:
            done.add(entry["id"])
            if entry["outcome"] == "failed":
                failed.add(entry["id"])
    return len(done), len(collected), len(failed)


def grade(submission: Path, root: Path, exercises: list[str] | None = None, hidden: Path | None = None,
          timeout: float = 120.0, tests: list[str] | None = None) -> list[ExerciseResult]:
    """The per-exercise results of ``grade_submission`` (scores from each exercise's own tests)."""
    return grade_submission(submission, root, exercises, hidden, timeout, tests).exercises


def grade_exercise(submission: Path, root: Path, exercise: str, hidden: Path | None = None,
                   timeout: float = 120.0, tests: list[str] | None = None) -> ExerciseResult:
    return grade(submission, root, [exercise], hidden, timeout, tests)[0]


def as_json_ready(results: list[ExerciseResult]) -> dict:
    return {"exercises": [asdict(r) for r in results],
            "total_score": round(sum(r.score for r in results) / len(results), 4) if results else 0.0}
