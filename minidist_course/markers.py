"""Solution markers: where the reference code holds an exercise's answer.

In the reference code a region looks like this (the markers sit at the indentation of the statements
they enclose, inside a function)::

    def ring_allreduce(comm, x):
        \"\"\"...\"\"\"
        # BEGIN SOLUTION ring_allreduce
        # BEGIN PROMPT
        # Hint: reduce-scatter first, then allgather.
        # END PROMPT
        ...the solution...
        # END SOLUTION

The student copy keeps the signature and docstring, comments chosen by ``exercises make --hints`` (the
prompt's lines are the ``full`` level's; student_copy.py), and replaces the rest of the region by
``raise NotImplementedError("exercise ring_allreduce: see lessons/05_collectives.py")``.
The registry of exercises (id, lesson, statement, hint) is registry.py; where each lives, its markers.
"""

from __future__ import annotations

import ast
import io
import re
import threading
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from .registry import Exercise, load_registry

BEGIN = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION (?P<id>[A-Za-z_][A-Za-z0-9_]*)[ \t]*$")
END = re.compile(r"^(?P<indent>[ \t]*)# END SOLUTION[ \t]*$")
PROMPT_BEGIN = re.compile(r"^[ \t]*# BEGIN PROMPT[ \t]*$")
PROMPT_END = re.compile(r"^[ \t]*# END PROMPT[ \t]*$")
ANY_MARKER = re.compile(r"#\s*(BEGIN|END) (SOLUTION|PROMPT)")

_PARSING = threading.Lock()


def parse_python(text: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse, one thread at a time: graders build trees in threads, and CPython 3.11's parser fails
    ("AST constructor recursion depth mismatch") when two threads parse at once."""
    with _PARSING:
        return ast.parse(text, filename=filename)


class MarkerError(ValueError):
    """Markers that are unbalanced, nested, misplaced, or name an unknown exercise."""


@dataclass
class Region:
    exercise: str
    path: str            # relative to the repository root, '/'-separated
    begin: int           # 0-based index of the BEGIN line
    end: int             # 0-based index of the END line
    indent: str
    prompt: list[str] = field(default_factory=list)   # the hint lines, as written (comments)
    function: str = ""   # qualified name of the enclosing function, e.g. "Linear.backward"


def find_regions(text: str, path: str) -> list[Region]:
    """Parse the markers of one file; raise MarkerError for anything malformed."""
    if not ANY_MARKER.search(text):        # most files: no marker anywhere, so none to tokenize for
        return []
    lines = text.splitlines()
    regions: list[Region] = []
    open_region: Region | None = None
    in_prompt = False
    for i in sorted(comment_lines(text)):
        line = lines[i]
        where = f"{path}:{i + 1}"
        if m := BEGIN.match(line):
            if open_region is not None:
                raise MarkerError(f"{where}: BEGIN SOLUTION {m['id']} inside the open region "
                                  f"{open_region.exercise} (line {open_region.begin + 1}): "
                                  "regions cannot nest")
            open_region = Region(m["id"], path, i, -1, m["indent"])
        elif m := END.match(line):
            if open_region is None:
                raise MarkerError(f"{where}: END SOLUTION without a BEGIN SOLUTION")
            if in_prompt:
                raise MarkerError(f"{where}: END SOLUTION inside an open BEGIN PROMPT")
            if m["indent"] != open_region.indent:
                raise MarkerError(f"{where}: END SOLUTION is indented differently from its BEGIN "
                                  f"(line {open_region.begin + 1})")
            open_region.end = i
            regions.append(open_region)
            open_region = None
        elif PROMPT_BEGIN.match(line):
            if open_region is None or in_prompt:
                raise MarkerError(f"{where}: BEGIN PROMPT must stand inside a solution region, once")
            in_prompt = True
        elif PROMPT_END.match(line):
            if not in_prompt:
                raise MarkerError(f"{where}: END PROMPT without BEGIN PROMPT")
            in_prompt = False
        elif ANY_MARKER.search(line):
            raise MarkerError(f"{where}: malformed marker {line.strip()!r}")
        elif in_prompt:
            open_region.prompt.append(line)
    if open_region is not None:
        raise MarkerError(f"{path}:{open_region.begin + 1}: BEGIN SOLUTION {open_region.exercise} "
                          f"is never closed")
    if regions:
        _attach_functions(text, path, regions)
    return regions


def comment_lines(text: str) -> set[int]:
    """0-based indices of the lines that hold nothing but a comment (tokenize: not text in a string)."""
    found = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and not tok.line[:tok.start[1]].strip():
            found.add(tok.start[0] - 1)
    return found


def function_spans(text: str) -> dict[str, tuple[int, int]]:
    """{qualified name: (first line incl. decorators, last line)}, 1-based, for every def in a file.

    The last line extends over trailing comment lines indented deeper than the ``def`` (the AST ends at
    the last statement, but a region's ``# END SOLUTION`` may follow it).
    """
    lines = text.splitlines()
    spans: dict[str, tuple[int, int]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                    last = child.end_lineno
                    def_indent = len(lines[child.lineno - 1]) - len(lines[child.lineno - 1].lstrip())
                    while last < len(lines) and lines[last].lstrip().startswith("#") and \
                            len(lines[last]) - len(lines[last].lstrip()) > def_indent:
                        last += 1
                    spans[name] = (first, last)
                visit(child, name + ".")

    visit(parse_python(text), "")
    return spans


def _attach_functions(text: str, path: str, regions: list[Region]) -> None:
    """Each region must lie inside one function; record that function's qualified name."""
    spans = function_spans(text)
    for region in regions:
        enclosing = [(first, name) for name, (first, last) in spans.items()
                     if first < region.begin + 1 and region.end + 1 <= last]
        if not enclosing:
            raise MarkerError(f"{path}:{region.begin + 1}: region {region.exercise} is not inside a function")
        region.function = max(enclosing)[1]   # the innermost: the one that starts last
    owners: dict[str, str] = {}
    for region in regions:
        if owners.setdefault(region.function, region.exercise) != region.exercise:
            raise MarkerError(f"{path}: function {region.function} holds regions of two exercises "
                              f"({owners[region.function]}, {region.exercise}); give each its own function")


def read_registry(root: Path) -> dict[str, Exercise]:
    """{id: Exercise} of the tree at root (its minidist_course/registry.py)."""
    try:
        return load_registry(root)
    except (FileNotFoundError, ValueError) as err:
        raise MarkerError(str(err)) from err


def python_files(root: Path) -> list[Path]:
    """The library's Python files that may hold regions (minidist/ only)."""
    return sorted(p for p in (Path(root) / "minidist").rglob("*.py") if "__pycache__" not in p.parts)


def all_regions(root: Path) -> list[Region]:
    """Every region in the library, in file order; ids checked against the registry."""
    root = Path(root)
    registry = read_registry(root)
    regions = []
    for path in python_files(root):
        rel = path.relative_to(root).as_posix()
        regions += find_regions(path.read_text(), rel)
    for region in regions:
        if region.exercise not in registry:
            raise MarkerError(f"{region.path}:{region.begin + 1}: unknown exercise {region.exercise!r} "
                              f"(not in minidist_course/registry.py)")
    return regions
