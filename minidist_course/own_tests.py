"""An exercise's own tests, counted one way for `exercises list`, `pytest --exercise` and the grader.

A test is exercise X's own test when it reaches X alone (tests/exercise_map.json), does not pass on a
trivially wrong stand-in of X (tests/exercise_standins.json), needs no optional extra that X does not
need, and can run here. The oracles (torch, ml_dtypes: pyproject's ``oracle`` extra) check an exercise's
values, so their tests count wherever the oracle is installed; the other extras (MPI, pyarrow) are about
a backend or a file format, never about an exercise, so their tests are never an exercise's own.

A test's extras are read from its source: ``pytest.importorskip("NAME")`` in the test function, in a
decorator it carries or at the module's top level, or a ``mpi_available()`` skip condition.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from functools import lru_cache
from pathlib import Path

from .exercise_map import STANDINS_PATH, load_map, own_exercise

ORACLES = ("torch", "ml_dtypes")    # extras whose tests still check the exercise
SKIP_NEEDS = re.compile(r"importorskip\(\s*[\"'](?P<module>\w+)[\"']|(?P<mpi>\bmpi_available\()")


def _needs(source: str) -> set[str]:
    return {m["module"] or "mpi4py" for m in SKIP_NEEDS.finditer(source)}


@lru_cache(maxsize=256)
def file_extras(path: Path) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """(what the whole module needs, {test function name: what it needs besides}) of one test file."""
    text = path.read_text()
    tree = ast.parse(text)
    top: set[str] = set()
    marks: dict[str, str] = {}
    functions: dict[str, frozenset[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.Expr)):
            source = ast.get_source_segment(text, node) or ""
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                    isinstance(node.targets[0], ast.Name):
                marks[node.targets[0].id] = source      # e.g. needs_mpi = pytest.mark.skipif(...)
            elif isinstance(node, ast.Assign) or "importorskip" in source:
                top |= _needs(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            source = ast.get_source_segment(text, node) or ""
            for deco in node.decorator_list:
                name = deco.id if isinstance(deco, ast.Name) else ""
                source += "\n" + marks.get(name, ast.get_source_segment(text, deco) or "")
            functions[node.name] = frozenset(_needs(source))
    top |= {m for name, src in marks.items() for m in _needs(src) if "importorskip" in src}
    return frozenset(top), functions


def test_extras(root: Path, test_id: str) -> set[str]:
    """The optional modules a test needs ("tests/x.py::test_y[3]" -> e.g. {"torch"})."""
    path, _, rest = test_id.partition("::")
    name = rest.split("::")[-1].split("[")[0]
    file = Path(root) / path
    if not file.exists():
        return set()
    top, functions = file_extras(file.resolve())
    return set(top | functions.get(name, frozenset()))


@lru_cache(maxsize=16)
def importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def counts_here(root: Path, test_id: str) -> bool:
    """Whether the test can be an exercise's own test here: only oracles among its extras, all installed."""
    extras = test_extras(root, test_id)
    return all(extra in ORACLES and importable(extra) for extra in extras)


def own_tests(root: Path, standins: bool = True) -> dict[str, list[str]]:
    """{exercise: its own tests here}, in the map's order. standins=False keeps the tests that pass on a
    stand-in (the stand-in check measures them)."""
    path = Path(root) / STANDINS_PATH
    weak = {(ex, t) for ex, tests in json.loads(path.read_text()).items() for t in tests} \
        if standins and path.exists() else set()
    found: dict[str, list[str]] = {}
    for test, ids in load_map(root).items():
        ex = own_exercise(ids)
        if ex is not None and (ex, test) not in weak and counts_here(root, test):
            found.setdefault(ex, []).append(test)
    return found
