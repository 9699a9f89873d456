"""Copies of the repository with their solution regions rewritten (student copy, map, grading tree).

``copy_tree(root, dest)`` copies the files git tracks (or every file outside caches). ``rewrite_regions``
applies one rule to every region of a file, bottom up: keep the solution (``solution_lines``), or cut it
(``cut_lines``: the prompt's hint, then ``raise NotImplementedError(...)``). A cut also drops the
statements that followed the region in its block (e.g. a ``return out`` after ``# END SOLUTION``): after a
``raise`` they could never run, and a student's solution supplies them. ``rewrite_files`` writes every file
of a copy that holds regions so rewritten (the student copy, the map's and the stand-ins' copies).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

from .markers import Region, parse_python


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


def copy_tree(root: Path, dest: Path, exclude: tuple[str, ...] = (), files: list[Path] | None = None) -> None:
    """Copy the repository's files (or ``files``, relative to root) to the new or empty directory dest
    (``exclude``: relative paths left out)."""
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists and is not empty: choose a new directory")
    for rel in repository_files(root) if files is None else files:
        if rel.as_posix() in exclude:
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(root) / rel, target)


def solution_lines(region: Region, lines: list[str]) -> list[str]:
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


def cut_lines(region: Region, lesson: str) -> list[str]:
    """What a cut region becomes: its hint lines, then the NotImplementedError naming the exercise."""
    message = f"exercise {region.exercise}: see {lesson}"
    return region.prompt + [f"{region.indent}raise NotImplementedError({message!r})"]


def trailing_end(text: str, region: Region, others: list[Region]) -> int:
    """0-based last line of the statements after ``region`` in its own block (region.end if none).

    Statements that hold another region are kept (the cut then leaves them, rather than lose a region).
    """
    first, last = region.begin + 1, region.end + 1            # 1-based marker lines
    for node in ast.walk(parse_python(text)):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if not isinstance(block, list) or not block or not isinstance(block[0], ast.stmt):
                continue
            inside = [s for s in block if first < s.lineno < last]
            if not inside or inside[0].col_offset != len(region.indent):
                continue
            after = [s for s in block if s.lineno > last]
            if not after:
                return region.end
            stop = max(s.end_lineno for s in after)           # 1-based, inclusive
            if any(last < o.begin + 1 <= stop for o in others):
                return region.end
            return stop - 1
    return region.end


def rewrite_regions(text: str, regions: list[Region], replace, cut_trailing=lambda region: False) -> str:
    """Replace every region of one file by ``replace(region, lines)`` (a list of lines), bottom up.

    ``cut_trailing(region)`` says whether the statements after the region in its block go too.
    """
    lines = text.splitlines(keepends=True)
    for region in sorted(regions, key=lambda r: r.begin, reverse=True):
        stop = trailing_end(text, region, regions) if cut_trailing(region) else region.end
        lines[region.begin:stop + 1] = [line + "\n" for line in replace(region, lines)]
    return "".join(lines)


def rewrite_files(root: Path, dest: Path, regions: list[Region], replace, cut_trailing=lambda region: False,
                  check=lambda text, path: None) -> None:
    """Write to dest each file of root that holds some of ``regions``, rewritten by ``rewrite_regions``
    (``check(text, path)`` may refuse the result by raising)."""
    by_file: dict[str, list[Region]] = {}
    for region in regions:
        by_file.setdefault(region.path, []).append(region)
    for rel, file_regions in by_file.items():
        text = rewrite_regions((Path(root) / rel).read_text(), file_regions, replace, cut_trailing)
        check(text, rel)
        (Path(dest) / rel).write_text(text)
