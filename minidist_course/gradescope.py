"""Gradescope: the autograder zip (``exercises autograder OUT.zip``) and its ``results.json``
(``exercises grade SUBMISSION --gradescope PATH``).

Gradescope's documented layout (gradescope-autograders.readthedocs.io, "Autograder Specifications"): the
zip's root holds ``setup.sh`` (run once, as root, when Gradescope builds the image, Ubuntu) and
``run_autograder`` (run once per submission, in /autograder); the zip is unpacked into /autograder/source,
the student's files arrive in /autograder/submission, and run_autograder must write
/autograder/results/results.json::

    {"score": 1.5, "max_score": 2.0, "output": "...", "tests": [
        {"name": "adam", "score": 0.5, "max_score": 1.0, "output": "...", "visibility": "visible"}, ...]}

The zip carries the whole reference tree (the package, its tests, the map), so the image grades exactly
as ``exercises grade`` does here: one test per graded exercise, worth POINTS, scored with the same
weights (the exercise's score, by promise); score / max_score is the grade's overall score. Each test's
output is that exercise's feedback, the top-level output the Markdown feedback of ``exercises grade``.
"""

from __future__ import annotations

import json
import shlex
import sys
import zipfile
from pathlib import Path

from minidist.nn.checks import seconds_option

from .grade import NOT_GRADED, SubmissionReport, graded_ids
from .markers import all_regions
from .options import exercise_ids
from .report import CUT, _first_failure, format_markdown
from .tree import repository_files

POINTS = 1.0                # each exercise's max_score: the grade's mean becomes score / max_score
VISIBILITY = "visible"      # Gradescope's values: hidden, after_due_date, after_published, visible
SCRIPTS = ("setup.sh", "run_autograder")

SETUP = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image (Ubuntu; Python 3.10 or newer):
# a virtual environment with minidist installed from this folder (/autograder/source), editable, so that
# the grader's reference is this folder, with the test extra the grader needs (pytest, hypothesis, ...).
set -euo pipefail
apt-get install -y python3 python3-pip python3-venv
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --upgrade pip
/autograder/venv/bin/pip install -e "/autograder/source[test]"
"""

RUN = """\
#!/usr/bin/env bash
# Gradescope runs this once per submission (written by `python -m minidist exercises autograder`): it grades
# /autograder/submission as `exercises grade` does and writes /autograder/results/results.json.
# $1: another root than /autograder (a test's); MINIDIST_PYTHON: another interpreter than setup.sh's venv.
ROOT="${{1:-/autograder}}"
PY="${{MINIDIST_PYTHON:-$ROOT/venv/bin/python}}"
mkdir -p "$ROOT/results"
cd "$ROOT/source" || exit 1
PYTHONPATH="$ROOT/source" "$PY" -m minidist exercises grade "$ROOT/submission" \\
    --gradescope "$ROOT/results/results.json"{options}
status=$?
# A grade of 0, or a submission refused, is still a result: Gradescope shows what results.json says.
[ -f "$ROOT/results/results.json" ] && exit 0
exit "$status"
"""


def exercise_feedback(result) -> str:
    """One exercise's feedback (a Gradescope test's output): tests passed, why not full marks, what to run."""
    lines = [f"{result.passed}/{result.total} own tests passed; score {result.score:.2f}"]
    if result.error:
        lines.append(f"code not taken: {result.error}")
    elif result.failing and all(CUT in f["message"] for f in result.failing):
        lines.append("not solved yet: every test stops at the exercise's NotImplementedError")
    else:
        if result.broken_promises():
            lines.append(f"promise broken: {', '.join(result.broken_promises())}")
        if first := _first_failure(result):
            lines.append(f"first failure: {first}")
    if result.skipped:
        lines.append(f"{result.skipped} skipped (they count neither way)")
    if result.score < 1.0:
        lines.append(f"run `python -m pytest --exercise {result.exercise}` in your copy to see every failure")
    return "\n".join(lines)


def results_json(report: SubmissionReport) -> dict:
    """Gradescope's results.json of one graded submission."""
    tests = [{"name": r.exercise, "score": round(r.score * POINTS, 4), "max_score": POINTS,
              "output": exercise_feedback(r), "visibility": VISIBILITY} for r in report.exercises]
    return {"score": round(sum(t["score"] for t in tests), 4), "max_score": POINTS * len(tests),
            "execution_time": round(report.seconds), "output": format_markdown(report),
            "visibility": VISIBILITY, "stdout_visibility": "hidden", "tests": tests}


def refused_json(exercises: list[str], reason: str) -> dict:
    """results.json of a submission that could not be graded at all: every exercise 0, the reason shown."""
    tests = [{"name": ex, "score": 0.0, "max_score": POINTS, "output": f"not graded: {reason}",
              "visibility": VISIBILITY} for ex in exercises]
    return {"score": 0.0, "max_score": POINTS * len(tests), "output": f"Not graded: {reason}",
            "visibility": VISIBILITY, "stdout_visibility": "hidden", "tests": tests}


def write_results(path: Path, results: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")


def write_refused(path: Path, root: Path, only: list[str] | None, reason: str) -> None:
    """Write refused_json for the exercises ``--only`` names (all by default); nothing if they are wrong
    (the instructor's options, not the submission: run_autograder then fails, as it should)."""
    try:
        ids = graded_ids(all_regions(root), exercise_ids(only))
    except ValueError:
        return
    write_results(path, refused_json(ids, reason))


def find_copy(submission: Path) -> Path:
    """The course copy in a Gradescope submission: the folder itself, or the one folder it holds when the
    student uploaded a zip of their copy's folder (Gradescope unpacks it as it is)."""
    submission = Path(submission)
    if (submission / "minidist" / "__init__.py").is_file() or not submission.is_dir():
        return submission
    inner = [p for p in submission.iterdir() if p.is_dir() and not p.name.startswith(("__MACOSX", "."))]
    if len(inner) == 1 and (inner[0] / "minidist" / "__init__.py").is_file() and not inner[0].is_symlink():
        return inner[0]
    return submission


def check_zip_path(out: Path) -> None:
    """ValueError unless OUT is a new .zip file, or an autograder zip this command wrote before."""
    out = Path(out)
    if out.suffix != ".zip":
        raise ValueError(f"OUT {str(out)!r}: expected a file name ending in .zip (Gradescope takes a zip)")
    if out.is_symlink() or (out.exists() and not out.is_file()):
        raise ValueError(f"OUT {str(out)!r} exists and is not a file: give a new .zip file name")
    if out.exists():
        try:
            with zipfile.ZipFile(out) as old:
                ours = set(SCRIPTS) <= set(old.namelist())
        except (zipfile.BadZipFile, OSError):
            ours = False
        if not ours:
            raise ValueError(f"OUT {str(out)!r} exists and is not an autograder zip: choose a new file name")
    blocking = [p for p in out.parents if p.exists() and not p.is_dir()]
    if blocking:
        raise ValueError(f"OUT {str(out)!r} lies under the file {str(blocking[-1])!r}")


def write_autograder(root: Path, out: Path, exercises: list[str], options: list[str] = ()) -> int:
    """Write the autograder zip: setup.sh, run_autograder and the reference tree (figures and benchmarks
    left out, as grading trees leave them). ``exercises``: the ids graded (validated by the caller);
    ``options``: more `exercises grade` options run_autograder passes. The same tree gives the same bytes.
    Returns the number of files in the zip."""
    root, out = Path(root).resolve(), Path(out)
    files = [f for f in repository_files(root) if not f.as_posix().startswith(NOT_GRADED)]
    clash = [name for name in SCRIPTS if Path(name) in files]
    if clash:
        raise ValueError(f"the reference holds {clash} at its root: they would clash with Gradescope's")
    args = ["--only", ",".join(exercises), *options]
    run = RUN.format(options=" \\\n    " + " ".join(shlex.quote(a) for a in args))
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:

        def add(name: str, data: bytes | str, executable: bool) -> None:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))    # fixed: the same bytes
            info.external_attr = (0o100755 if executable else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)

        add("setup.sh", SETUP, True)
        add("run_autograder", run, True)
        for rel in files:
            add(rel.as_posix(), (root / rel).read_bytes(), bool((root / rel).stat().st_mode & 0o111))
    return len(files) + len(SCRIPTS)


def cmd_autograder(args) -> int:
    try:
        ids = graded_ids(all_regions(args.root), exercise_ids(args.only))
        check_zip_path(Path(args.out))
        count = write_autograder(args.root, Path(args.out), ids, ["--timeout", str(args.timeout),
                                                                  "--limit", str(args.limit)])
    except ValueError as err:
        print(f"exercises autograder: {err}", file=sys.stderr)
        return 2
    print(f"{args.out}: a Gradescope autograder ({count} files) grading {len(ids)} exercise(s): "
          f"{', '.join(ids)}")
    return 0


def add_autograder_parser(verbs, wrap) -> None:
    """Register `exercises autograder` (``wrap``: cli's check that the tree is the reference)."""
    ag = verbs.add_parser("autograder", help="write a Gradescope autograder zip that grades one submission")
    ag.add_argument("out", help="the .zip file to write (upload it as the assignment's autograder)")
    ag.add_argument("--only", action="append", metavar="ID", help="grade only these exercises")
    ag.add_argument("--timeout", type=seconds_option, default=30.0, help="seconds per test (default 30)")
    ag.add_argument("--limit", type=seconds_option, default=300.0, help="seconds per exercise (default 300)")
    ag.set_defaults(func=wrap(cmd_autograder))
