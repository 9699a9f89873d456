"""Make a student copy of the repository: every selected solution region cut out.

``make_student_copy(root, dest, only=None)`` copies the repository's files (those git tracks, when it is
a git checkout) to ``dest`` and rewrites each library file that holds regions:

* a selected region becomes its prompt lines (the hint, if any) and
  ``raise NotImplementedError("exercise <id>: see <lesson>")``, at the region's indentation;
* an unselected region keeps its solution code; only its marker and prompt lines go.

No marker line survives, every rewritten file must parse, and the same input gives the same bytes.
``instrumented_copy`` is the same walk for the coverage map: each region keeps its code and first records
that it was reached (see exercise_map.py).
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path

from .markers import ANY_MARKER, MarkerError, Region, all_regions, comment_lines, read_registry

STUDENT_STAMP = ".minidist-student.json"
HITS_MODULE = "_minidist_exercise_hits"


def repository_files(root: Path) -> list[Path]:
    """Files to copy, relative to root: git's tracked files, or every file outside caches and .git."""
    root = Path(root)
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
        files = [Path(p) for p in out.decode().split("\0") if p]
        if files:
            return sorted(f for f in files if (root / f).is_file())
    except (OSError, subprocess.CalledProcessError):
        pass
    skip = {".git", "__pycache__", ".pytest_cache", ".hypothesis"}
    return sorted(p.relative_to(root) for p in root.rglob("*")
                  if p.is_file() and not skip & set(p.relative_to(root).parts)
                  and not p.name.endswith(".egg-info"))


def _rewrite(text: str, regions: list[Region], replace) -> str:
    """Apply ``replace(region) -> list of lines`` to every region of one file, bottom up."""
    lines = text.splitlines(keepends=True)
    for region in sorted(regions, key=lambda r: r.begin, reverse=True):
        lines[region.begin:region.end + 1] = [line + "\n" for line in replace(region, lines)]
    return "".join(lines)


def _solution_lines(region: Region, lines: list[str]) -> list[str]:
    """The region's code without its marker and prompt lines."""
    body, in_prompt = [], False
    for line in lines[region.begin + 1:region.end]:
        stripped = line.strip()
        if stripped == "# BEGIN PROMPT":
            in_prompt = True
        elif stripped == "# END PROMPT":
            in_prompt = False
        elif not in_prompt:
            body.append(line.rstrip("\n"))
    return body


def _check_output(text: str, path: str) -> None:
    try:
        ast.parse(text, filename=path)
    except SyntaxError as err:
        raise MarkerError(f"{path}: the rewritten file does not parse ({err.msg}, line {err.lineno})") from err
    for i in comment_lines(text):
        if ANY_MARKER.search(text.splitlines()[i]):
            raise MarkerError(f"{path}:{i + 1}: a marker survived the rewrite")


def _copy_tree(root: Path, dest: Path) -> None:
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists and is not empty: choose a new directory")
    for rel in repository_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)


def make_student_copy(root: Path, dest: Path, only: list[str] | None = None) -> list[str]:
    """Write the student copy to ``dest``; return the ids of the exercises that were cut."""
    root, dest = Path(root).resolve(), Path(dest).resolve()
    registry = read_registry(root)
    regions = all_regions(root)
    known = sorted({r.exercise for r in regions})
    selected = known if only is None else list(only)
    unknown = [e for e in selected if e not in known]
    if unknown:
        raise MarkerError(f"unknown exercise(s) {unknown}; the library has regions for {known}")
    _check_reached(root, known)

    def cut(region: Region, lines: list[str]) -> list[str]:
        if region.exercise not in selected:
            return _solution_lines(region, lines)
        lesson = registry[region.exercise].lesson
        message = f"exercise {region.exercise}: see {lesson}"
        return region.prompt + [f"{region.indent}raise NotImplementedError({message!r})"]

    _copy_tree(root, dest)
    by_file: dict[str, list[Region]] = {}
    for region in regions:
        by_file.setdefault(region.path, []).append(region)
    for rel, file_regions in by_file.items():
        text = _rewrite((root / rel).read_text(), file_regions, cut)
        _check_output(text, rel)
        (dest / rel).write_text(text)
    (dest / STUDENT_STAMP).write_text(json.dumps({"cut": sorted(selected)}, indent=1) + "\n")
    return sorted(selected)


def instrumented_copy(root: Path, dest: Path) -> None:
    """A copy whose regions each record a hit before running their own code (for the coverage map)."""
    root, dest = Path(root).resolve(), Path(dest).resolve()

    def record_then_run(region: Region, lines: list[str]) -> list[str]:
        hit = f"{region.indent}import {HITS_MODULE} as _hits; _hits.record({region.exercise!r})"
        return [hit] + _solution_lines(region, lines)

    _copy_tree(root, dest)
    # The recorder sits at the copy's root (on PYTHONPATH), independent of the copied package.
    shutil.copy2(Path(__file__).with_name("hits.py"), dest / f"{HITS_MODULE}.py")
    by_file: dict[str, list[Region]] = {}
    for region in all_regions(root):
        by_file.setdefault(region.path, []).append(region)
    for rel, file_regions in by_file.items():
        (dest / rel).write_text(_rewrite((root / rel).read_text(), file_regions, record_then_run))


def _check_reached(root: Path, exercises: list[str]) -> None:
    """Every exercise must be reached by at least one test (tests/exercise_map.json)."""
    from .exercise_map import load_map

    reached = {e for ids in load_map(root).values() for e in ids}
    missing = [e for e in exercises if e not in reached]
    if missing:
        raise MarkerError(f"no test reaches exercise(s) {missing}: add tests, then run "
                          f"`python -m minidist exercises map`")
