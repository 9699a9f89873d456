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
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .exercise_map import STANDINS_PATH, UNMAPPED_PREFIXES, load_map, own_exercise

ORACLES = ("torch", "ml_dtypes")    # extras whose tests still check the exercise
SKIP_NEEDS = re.compile(r"importorskip\(\s*[\"'](?P<module>\w+)[\"']|(?P<mpi>\bmpi_available\()")


def _needs(source: str) -> set[str]:
    return {m["module"] or "mpi4py" for m in SKIP_NEEDS.finditer(source)}


EXPLICIT = re.compile(r"mark\.exercise\(\s*[\"'](?P<id>\w+)[\"']")


@dataclass(frozen=True)
class SourceFacts:
    """What one test file's source says: the extras the whole module needs, and per test function the
    extras it needs besides and the exercises it is marked with (``pytest.mark.exercise``, its own or the
    module's ``pytestmark``)."""
    needs: frozenset[str]
    function_needs: dict[str, frozenset[str]]
    function_marks: dict[str, frozenset[str]]
    parametrized: frozenset[str]


@lru_cache(maxsize=256)
def read_source_facts(path: Path) -> SourceFacts:
    text = path.read_text()
    tree, lines = ast.parse(text), text.splitlines()

    def segment(node) -> str:     # the node's whole lines (ast.get_source_segment re-splits the text)
        return "\n".join(lines[node.lineno - 1:node.end_lineno])

    top: set[str] = set()
    marks: dict[str, str] = {}
    module_marks: set[str] = set()
    needs, explicit, parametrized = {}, {}, set()
    for node in tree.body:
        source = segment(node)
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            marks[node.targets[0].id] = source      # e.g. needs_mpi = pytest.mark.skipif(...)
            if node.targets[0].id == "pytestmark":
                module_marks |= {m["id"] for m in EXPLICIT.finditer(source)}
            if "importorskip" in source:
                top |= _needs(source)
        elif isinstance(node, (ast.Assign, ast.Expr)) and "importorskip" in source:
            top |= _needs(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            source = segment(node)
            decorators = "\n".join(marks.get(deco.id, "") if isinstance(deco, ast.Name) else
                                   segment(deco) for deco in node.decorator_list)
            needs[node.name] = frozenset(_needs(source + "\n" + decorators))
            explicit[node.name] = frozenset(module_marks | {m["id"] for m in EXPLICIT.finditer(decorators)})
            if "parametrize" in decorators:
                parametrized.add(node.name)
    return SourceFacts(frozenset(top), needs, explicit, frozenset(parametrized))


def _split(test_id: str) -> tuple[str, str]:
    path, _, rest = test_id.partition("::")
    return path, rest.split("::")[-1].split("[")[0]


def extras_of(root: Path, test_id: str) -> set[str]:
    """The optional modules a test needs ("tests/x.py::test_y[3]" -> e.g. {"torch"})."""
    path, name = _split(test_id)
    file = Path(root) / path
    if not file.exists():
        return set()
    facts = read_source_facts(file.resolve())
    return set(facts.needs | facts.function_needs.get(name, frozenset()))


def reached(root: Path) -> dict[str, list[str]]:
    """{test id: the exercises it carries}: the map's, and the marks tests/conftest.py adds from the source
    (``pytest.mark.exercise``) — also for tests the map does not list yet (unparametrized ones: a
    parametrized test's ids come from its run: `exercises map`)."""
    mapping = {test: set(ids) for test, ids in load_map(root).items()}
    bases: dict[tuple[str, str], list[str]] = {}
    for test in mapping:
        bases.setdefault(_split(test), []).append(test)
    for file in sorted((Path(root) / "tests").rglob("test_*.py")):
        rel = file.relative_to(root).as_posix()
        if rel.startswith(UNMAPPED_PREFIXES) or "mark.exercise(" not in file.read_text():
            continue
        facts = read_source_facts(file.resolve())
        for name, ids in facts.function_marks.items():
            if not ids:
                continue
            for test in bases.get((rel, name), ()):
                mapping[test] |= ids
            if (rel, name) not in bases and name not in facts.parametrized:
                mapping[f"{rel}::{name}"] = set(ids)
    return {test: sorted(ids) for test, ids in mapping.items()}


@lru_cache(maxsize=16)
def importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def counts_here(root: Path, test_id: str) -> bool:
    """Whether the test can count for an exercise here: only oracles among its extras, all installed."""
    extras = extras_of(root, test_id)
    return all(extra in ORACLES and importable(extra) for extra in extras)


def own_tests(root: Path, standins: bool = True) -> dict[str, list[str]]:
    """{exercise: its own tests here}, in the map's order. standins=False keeps the tests that pass on a
    stand-in (the stand-in check measures them)."""
    path = Path(root) / STANDINS_PATH
    weak = {(ex, t) for ex, tests in json.loads(path.read_text()).items() for t in tests} \
        if standins and path.exists() else set()
    found: dict[str, list[str]] = {}
    for test, ids in reached(root).items():
        ex = own_exercise(ids)
        if ex is not None and (ex, test) not in weak and counts_here(root, test):
            found.setdefault(ex, []).append(test)
    return found
