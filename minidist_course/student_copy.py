"""Make a student copy of the repository: the selected solution regions cut out.

``make_student_copy(root, dest, only=None, keep=None)`` copies the repository's files (those git tracks,
when it is a git checkout) to ``dest`` and rewrites each library file that holds regions:

* a cut region becomes its prompt lines (the hint, if any) and
  ``raise NotImplementedError("exercise <id>: see <lesson>")``, at the region's indentation, and nothing
  follows the raise in its block;
* a kept region keeps its solution code; only its marker and prompt lines go.

``only`` names the exercises to cut (default: all), ``keep`` the ones to leave solved. The copy's
README.md is addressed to students (what to implement, how to check one exercise, how to run the
lessons) and the instructor's guide (lessons/TEACHING.md) stays out. The copy's minidist/__init__.py ends
with a call that makes a lesson run directly stop kindly at an unsolved exercise (unsolved.py). No marker
line survives, every rewritten file must parse, and the same input gives the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

from .catalog import student_readme
from .exercise_map import HITS_MODULE, instrumented_copy, load_map  # noqa: F401  (still importable here)
from .markers import (
    ANY_MARKER,
    MarkerError,
    Region,
    all_regions,
    comment_lines,
    parse_python,
    read_registry,
)
from .tree import copy_tree, cut_lines, rewrite_files, solution_lines

STUDENT_STAMP = ".minidist-student.json"
LESSON_HOOK = """
# Student copy only (added by `exercises make`): a lesson that reaches an unsolved exercise says which and
# exits with status 1 instead of a traceback.
from minidist_course.unsolved import stop_lessons_kindly as _stop_lessons_kindly  # noqa: E402

_stop_lessons_kindly()
"""
INSTRUCTOR_ONLY = ("lessons/TEACHING.md",)


def check_output(text: str, path: str) -> None:
    """A rewritten file must parse and hold no marker."""
    try:
        parse_python(text, filename=str(path))
    except SyntaxError as err:
        raise MarkerError(f"{path}: the rewritten file does not parse ({err.msg}, line {err.lineno})"
                          ) from err
    for i in comment_lines(text):
        if ANY_MARKER.search(text.splitlines()[i]):
            raise MarkerError(f"{path}:{i + 1}: a marker survived the rewrite")


def select(known: list[str], only: list[str] | None = None, keep: list[str] | None = None) -> list[str]:
    """The exercises to cut: ``only`` (default: all known) minus ``keep``; unknown ids are an error."""
    if only is not None and not only:
        raise MarkerError("only=[]: expected the ids of the exercises to cut (None: all of them)")
    unknown = sorted((set(only or []) | set(keep or [])) - set(known))
    if unknown:
        raise MarkerError(f"unknown exercise(s) {unknown}; the library has regions for {known}")
    return sorted(set(known if only is None else only) - set(keep or []))


def write_cut_files(root: Path, dest: Path, regions: list[Region], cut: list[str]) -> None:
    """Rewrite, in dest, every file of root that holds regions: cut the exercises ``cut``, keep the rest."""
    registry = read_registry(root)

    def rule(region: Region, lines: list[str]) -> list[str]:
        if region.exercise in cut:
            return cut_lines(region, registry[region.exercise].lesson)
        return solution_lines(region, lines)

    rewrite_files(root, dest, regions, rule, cut_trailing=lambda region: region.exercise in cut,
                  check=check_output)


def make_student_copy(root: Path, dest: Path, only: list[str] | None = None,
                      keep: list[str] | None = None) -> list[str]:
    """Write the student copy to ``dest``; return the ids of the exercises that were cut."""
    root, dest = Path(root).resolve(), Path(dest).resolve()
    regions = all_regions(root)
    known = sorted({r.exercise for r in regions})
    cut = select(known, only, keep)
    _check_reached(root, known)
    copy_tree(root, dest, exclude=INSTRUCTOR_ONLY)
    write_cut_files(root, dest, regions, cut)
    readme = dest / "README.md"
    original = readme.read_text() if readme.exists() else "# minidist\n"
    readme.write_text(student_readme(original, read_registry(root), regions, cut))
    init = dest / "minidist" / "__init__.py"
    if (dest / "minidist_course" / "unsolved.py").exists():    # (a toy course may have none)
        init.write_text(init.read_text() + LESSON_HOOK)
    (dest / STUDENT_STAMP).write_text(json.dumps({"cut": cut}, indent=1) + "\n")
    return cut


def _check_reached(root: Path, exercises: list[str]) -> None:
    """Every exercise must be reached by at least one test (tests/exercise_map.json)."""
    reached = {e for ids in load_map(root).values() for e in ids}
    missing = [e for e in exercises if e not in reached]
    if missing:
        raise MarkerError(f"no test reaches exercise(s) {missing}: add tests, then run "
                          f"`python -m minidist exercises map`")
