"""Grade a student's copy with the reference tests: each exercise alone, in a pytest session of its own.

For each graded exercise X the grader builds a tree from the reference in which every other exercise
keeps its reference solution and X holds the *student's* version of each function that holds X's
regions (by qualified name; a function the submission lacks leaves X cut, and the grade says why).
Everything else — other code, the tests — is the reference's. It adds the instructor's hidden tests if
any, then runs X's own tests (``pytest --exercise X``) in a session watched from outside
(sessions.py): a test that hangs or crashes is killed or noticed, counted as such, and the session
resumes with the tests left. Nothing one exercise does — a hang, ``os._exit``, a killed process — can
reach another exercise's tests: they run in other processes, on trees where the first is solved.
Integration tests (they reach several exercises) run on request, in one more session on a tree with
every graded exercise taken from the submission, and are reported beside the scores, never in them.
Sessions of one submission, and of a whole class, run ``jobs`` at a time (classroom.py).

Hidden tests are ordinary pytest files that carry ``@pytest.mark.exercise("<id>")`` themselves.
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .exercise_map import UNMAPPED_PREFIXES, load_map, own_exercise
from .markers import Region, all_regions, function_spans, read_registry
from .results import ExerciseResult, IntegrationResult, TestResult, environment, score_exercises
from .sessions import grading_env, pytest_command, run_session
from .student_copy import write_cut_files
from .tree import copy_tree, repository_files, rewrite_regions, solution_lines

PLUGIN = "_minidist_grade_report"


@dataclass
class SubmissionReport:
    submission: str
    status: str                    # graded | incomplete (a test hung, crashed or was not run) | error
    seconds: float
    environment: dict
    exercises: list[ExerciseResult]
    integration: list[IntegrationResult] = field(default_factory=list)
    incidents: list[dict] = field(default_factory=list)  # {exercise, test, outcome, message}: hung, crashed
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


@dataclass
class Reference:
    """What every grading session reads from the reference tree, read once per grade (a class shares it)."""
    root: Path
    regions: list[Region]
    files: list[Path]                   # the files a grading tree copies (relative to root)
    test_map: dict[str, list[str]]      # tests/exercise_map.json
    promises: dict[str, dict[str, float]]   # {exercise: {promise: weight}} (registry.py)
    marked: dict[str, list[str]]            # {exercise: test files new to the map that mark it}
    solved: dict[str, str]                  # {file with regions: its text with every region solved}

    @classmethod
    def read(cls, root: Path) -> Reference:
        root = Path(root).resolve()
        files = [f for f in repository_files(root) if not f.as_posix().startswith(NOT_GRADED)]
        promises = {ex.id: dict(ex.promises) for ex in read_registry(root).values()}
        test_map, marked = load_map(root), {}
        mapped = {test.split("::")[0] for test in test_map}
        for name in (rel.as_posix() for rel in files):
            if name.startswith("tests/") and name.endswith(".py") and name not in mapped \
                    and not name.startswith(UNMAPPED_PREFIXES):
                for ex in set(MARK.findall((root / name).read_text())):
                    marked.setdefault(ex, []).append(name)
        regions, solved = all_regions(root), {}
        for path in {r.path for r in regions}:      # what most files of a grading tree hold: done once
            mine = [r for r in regions if r.path == path]
            solved[path] = rewrite_regions((root / path).read_text(), mine, solution_lines)
        return cls(root, regions, files, test_map, promises, marked, solved)

    def own_test_files(self, exercise: str) -> list[str]:
        """The test files that hold the exercise's own tests: those the map says, and new files (not yet in
        the map) that mark a test with it by hand."""
        mapped = {t.split("::")[0] for t, ids in self.test_map.items() if own_exercise(ids) == exercise}
        return sorted(mapped | set(self.marked.get(exercise, ())))

    def integration_files(self, graded: list[str]) -> list[str]:
        return sorted({t.split("::")[0] for t, ids in self.test_map.items()
                       if len(ids) > 1 and set(ids) <= set(graded)})


def submission_text(submission: Path, path: str) -> str:
    """The text of the submission's file ``path``, read only where it lies inside the submission.

    ValueError, in one line, for what cannot be graded as the student's own file: no such file, a link
    (anywhere on the path) that leads out of the submission (to the reference or a classmate's copy), a
    folder or anything else where a file belongs, a file that cannot be read or is not text."""
    top = Path(submission).resolve()
    where = top / path
    try:
        real = where.resolve(strict=True)
    except (OSError, RuntimeError):              # missing, a dangling or looping link
        raise ValueError(f"the submission has no {path}") from None
    if not real.is_relative_to(top):
        raise ValueError(f"a link that leads out of the submission (to {real}): a submission is graded "
                         "on its own files only")
    if not real.is_file():
        raise ValueError("not a file (a folder or a special file) where the exercise's file belongs")
    try:
        return real.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot be read ({getattr(err, 'strerror', None) or err})") from None


NOT_GRADED = ("figures/", "benchmarks/")     # no test reads them: grading trees leave them out
MARK = re.compile(r"""mark\.exercise\(\s*["'](\w+)["']""")          # a test marked by hand


def build_grading_tree(submission: Path, ref: Reference, tree: Path, exercises: list[str]) -> dict[str, str]:
    """The reference at ``tree`` with the graded exercises' functions taken from the submission.

    Returns {exercise: why its code could not be taken} for the exercises left cut."""
    graded_files = {r.path for r in ref.regions if r.exercise in exercises}
    regions = [r for r in ref.regions if r.path in graded_files]
    copy_tree(ref.root, tree, files=ref.files)
    for path in set(ref.solved) - graded_files:
        (tree / path).write_text(ref.solved[path])
    write_cut_files(ref.root, tree, regions, exercises)
    errors: dict[str, str] = {}
    for path in sorted({r.path for r in regions if r.exercise in exercises}):
        text = (tree / path).read_text()
        for ex in sorted({r.exercise for r in regions if r.path == path and r.exercise in exercises}):
            names = {r.function for r in regions if r.path == path and r.exercise == ex}
            try:
                text = splice_functions(text, submission_text(submission, path), names)
            except (ValueError, SyntaxError) as err:
                errors[ex] = f"{path}: {err}"
        (tree / path).write_text(text)
    shutil.copy2(Path(__file__).with_name("pytest_report.py"), tree / f"{PLUGIN}.py")
    return errors


def check_submission(submission: Path, regions: list[Region]) -> None:
    """Refuse at once a directory that is not a copy of the course (before any minute is spent on it)."""
    submission = Path(submission)
    if not submission.is_dir():
        raise ValueError(f"submission {submission} is not a directory")
    files = sorted({r.path for r in regions})
    # Something where an exercise's file belongs: a course copy (a folder or a link out there is refused
    # per exercise, by submission_text, and the others are graded).
    present = [f for f in files if (submission / f).exists() or (submission / f).is_symlink()]
    if not (submission / "minidist" / "__init__.py").is_file() or not present:
        raise ValueError(
            f"{submission} is not a copy of the course: a copy (made by `python -m minidist exercises "
            f"make`) holds the package minidist/ with the files that hold the exercises, e.g. "
            f"{', '.join(files[:3])}; found none of them. Give the directory of one student's copy "
            f"(or several: SUBMISSIONS/*).")


def student_keys(submission: Path, regions: list[Region], exercises: list[str]) -> dict[str, str]:
    """{exercise: the submission's source of the functions that hold its regions (or why it has none)}.

    Two submissions with the same code for an exercise get the same grade for it, so it is run once.
    Each file is read and parsed once."""
    parts: dict[str, list[str]] = {ex: [] for ex in exercises}
    for path in sorted({r.path for r in regions if r.exercise in exercises}):
        try:
            lines = submission_text(submission, path).splitlines()
            spans = function_spans("\n".join(lines))
        except (SyntaxError, ValueError) as err:
            lines, spans = [], {None: f"{type(err).__name__}: {err}"}
        for ex in sorted({r.exercise for r in regions if r.path == path and r.exercise in exercises}):
            for name in sorted({r.function for r in regions if r.path == path and r.exercise == ex}):
                if None in spans:
                    parts[ex].append(f"{path}: {spans[None]}")
                elif name in spans:
                    first, last = spans[name]
                    parts[ex].append(f"{path}::{name}\n" + "\n".join(lines[first - 1:last]))
                else:
                    parts[ex].append(f"{path}::{name} missing")
    return {ex: "\n".join(found) for ex, found in parts.items()}


@dataclass
class Job:
    """One pytest session of a grade: one exercise's own tests, or (exercise None) the integration tests."""
    submission: Path
    exercise: str | None
    graded: list[str]


def run_job(job: Job, ref: Reference, work: Path, hidden: Path | None, timeout: float, limit: float
            ) -> tuple[list[TestResult], dict[str, str], str, float]:
    """(tests with outcomes, {exercise: why its code was not taken}, pytest's error if any, seconds)."""
    tree = work / "repo"
    own = [job.exercise] if job.exercise else job.graded
    errors = build_grading_tree(job.submission, ref, tree, own)   # threads: see markers.parse_python
    if job.exercise:
        paths = ref.own_test_files(job.exercise)
        if hidden is not None:
            shutil.copytree(hidden, tree / "tests" / "hidden")
            (tree / "tests" / "hidden" / "__init__.py").touch()
            paths.append("tests/hidden")
        env = grading_env(tree)
    else:
        paths = ref.integration_files(job.graded)
        env = dict(grading_env(tree), MINIDIST_GRADE_ONLY_INTEGRATION="1")
    if not paths:
        return [], errors, "", 0.0
    cmd = pytest_command(sys.executable, PLUGIN) + [a for ex in own for a in ("--exercise", ex)]
    outcome = run_session(cmd, paths, tree, env, work, timeout, limit)
    return outcome.tests, errors, outcome.error, outcome.seconds


def assemble(submission: Path, graded: list[str], done: dict, seconds: float, workers: int,
             promises: dict[str, dict[str, float]] | None = None) -> SubmissionReport:
    """The report of one submission from its jobs' results ({exercise or None: run_job's tuple})."""
    scored, integration, incidents, logs = [], [], [], []
    for ex in graded:
        tests, errors, error, secs = done[ex]
        if error and not tests:
            errors = dict(errors, **{ex: errors.get(ex) or "pytest could not collect the tests (see below)"})
            logs.append(f"{ex}:\n{error}")
        [result], _ = score_exercises(tests, [ex], errors, promises)
        result.seconds = round(secs, 1)
        scored.append(result)
    if None in done:
        tests, _, error, _ = done[None]
        integration = score_exercises(tests, [], {})[1]
        if error and not tests:
            logs.append(f"integration tests:\n{error}")
    for key, (tests, *_rest) in done.items():
        incidents += [{"exercise": key or "integration", "test": t.id, "outcome": t.outcome,
                       "message": t.message} for t in tests if t.outcome in ("hung", "crashed")]
    status = "error" if logs else ("incomplete" if any(
        f["outcome"] in ("hung", "crashed", "not run") for r in scored for f in r.failing) else "graded")
    return SubmissionReport(str(submission), status, round(seconds, 1), environment(workers), scored,
                            integration, incidents, "\n".join(logs))


def graded_ids(regions: list[Region], exercises: list[str] | None) -> list[str]:
    known = sorted({r.exercise for r in regions})
    if exercises is not None and not exercises:
        raise ValueError("exercises=[]: expected the ids of the exercises to grade (None: all of them)")
    ids = sorted(exercises) if exercises else known
    unknown = sorted(set(ids) - set(known))
    if unknown:
        raise ValueError(f"unknown exercise(s) {unknown}; the library has regions for {known}")
    return ids
