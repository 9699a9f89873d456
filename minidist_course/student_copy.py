"""Make a student copy of the repository: the selected solution regions cut out.

``make_student_copy(root, dest, only=None, keep=None)`` copies the repository's files (those git tracks,
when it is a git checkout) to ``dest`` and rewrites each library file that holds regions:

* a cut region becomes its prompt lines (the hint, if any) and
  ``raise NotImplementedError("exercise <id>: see <lesson>")``, at the region's indentation, and nothing
  follows the raise in its block;
* a kept region keeps its solution code; only its marker and prompt lines go.

``only`` names the exercises to cut (default: all), ``keep`` the ones to leave solved. ``hints`` says how
much a cut region still tells (HINT_LEVELS); at every level the function keeps its signature and the
docstring that states its contract (shapes, formula):

* ``none``: the raise alone;
* ``outline`` (the default): comments with the exercise's statement and idea, the prose of
  lessons/EXERCISES.md (registry.py), then the raise;
* ``full``: the outline, then the region's own hint lines (its ``# BEGIN PROMPT`` block), then the raise.

The grader never reads a copy's hints (it takes the student's functions whole), so the level changes no
grade. The copy's
README.md is addressed to students (what to implement, how to check one exercise, how to run the
lessons) and the instructor's guide (lessons/TEACHING.md) stays out. The copy's minidist/__init__.py ends
with a call that makes a lesson run directly stop kindly at an unsolved exercise (unsolved.py). No marker
line survives, every rewritten file must parse, and the same input gives the same bytes.
"""

from __future__ import annotations

import json
import textwrap
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
HINT_LEVELS = ("none", "outline", "full")


def hint_lines(region: Region, exercise, hints: str) -> list[str]:
    """The comment lines a cut region keeps above its raise at level ``hints`` (module docstring)."""
    if hints not in HINT_LEVELS:
        raise ValueError(f"hints={hints!r}: expected one of {', '.join(HINT_LEVELS)}")
    if hints == "none":
        return []

    def comment(text: str) -> list[str]:
        return textwrap.wrap(text, width=110, initial_indent=f"{region.indent}# ",
                             subsequent_indent=f"{region.indent}#   ")

    lines = comment(f"Exercise {exercise.id} ({exercise.lesson}): {exercise.statement}")
    if exercise.hint:
        lines += comment(f"Idea: {exercise.hint}")
    return lines + (region.prompt if hints == "full" else [])


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


def write_cut_files(root: Path, dest: Path, regions: list[Region], cut: list[str], hints: str = "full"
                    ) -> None:
    """Rewrite, in dest, every file of root that holds regions: cut the exercises ``cut`` (their regions
    keep the comments of level ``hints``), keep the rest."""
    registry = read_registry(root)

    def rule(region: Region, lines: list[str]) -> list[str]:
        if region.exercise in cut:
            ex = registry[region.exercise]
            return hint_lines(region, ex, hints) + cut_lines(region, ex.lesson)[-1:]   # [-1]: the raise
        return solution_lines(region, lines)

    rewrite_files(root, dest, regions, rule, cut_trailing=lambda region: region.exercise in cut,
                  check=check_output)


def make_student_copy(root: Path, dest: Path, only: list[str] | None = None,
                      keep: list[str] | None = None, hints: str = "outline") -> list[str]:
    """Write the student copy to ``dest``; return the ids of the exercises that were cut."""
    if hints not in HINT_LEVELS:
        raise ValueError(f"hints={hints!r}: expected one of {', '.join(HINT_LEVELS)}")
    root, dest = Path(root).resolve(), Path(dest).resolve()
    regions = all_regions(root)
    known = sorted({r.exercise for r in regions})
    cut = select(known, only, keep)
    _check_reached(root, known)
    copy_tree(root, dest, exclude=INSTRUCTOR_ONLY)
    write_cut_files(root, dest, regions, cut, hints)
    readme = dest / "README.md"
    original = readme.read_text() if readme.exists() else "# minidist\n"
    readme.write_text(student_readme(original, read_registry(root), regions, cut))
    init = dest / "minidist" / "__init__.py"
    if (dest / "minidist_course" / "unsolved.py").exists():    # (a toy course may have none)
        init.write_text(init.read_text() + LESSON_HOOK)
    (dest / STUDENT_STAMP).write_text(json.dumps({"cut": cut, "hints": hints}, indent=1) + "\n")
    return cut


def _check_reached(root: Path, exercises: list[str]) -> None:
    """Every exercise must be reached by at least one test (tests/exercise_map.json)."""
    reached = {e for ids in load_map(root).values() for e in ids}
    missing = [e for e in exercises if e not in reached]
    if missing:
        raise MarkerError(f"no test reaches exercise(s) {missing}: add tests, then run "
                          f"`python -m minidist exercises map`")
