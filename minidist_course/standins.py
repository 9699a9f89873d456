"""Trivially wrong solutions, made from the regions, that an exercise's own tests must reject.

For every exercise three stand-ins replace its regions (and what follows them in their block):

* ``identity`` returns the function's first input unchanged (a function that updates in place: nothing);
* ``zeros`` returns zeros shaped like that input;
* ``rank0`` (functions that take ``comm``) returns rank 0's input on every rank.

The input is the enclosing function's first parameter other than self, comm and rng. A test that passes
on a stand-in does not test the exercise: ``python -m minidist exercises standins --write`` records such
tests in tests/exercise_standins.json and tests/conftest.py leaves them out of ``--exercise`` (so out of
the grade). ``exercises standins`` (CI) grades the three stand-ins and fails if one scores more than
MAX_SCORE of an exercise's own tests, or if an exercise has no own test left.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from minidist.nn.checks import check_count, check_real

from .exercise_map import STANDINS_PATH
from .grade import Job, Reference, run_job
from .markers import Region, all_regions, parse_python
from .tree import copy_tree, rewrite_files

KINDS = ("identity", "zeros", "rank0")
MAX_SCORE = 0.10
SKIPPED_PARAMETERS = ("self", "cls", "comm", "rng")


def stand_in(kind: str, value, comm=None):
    """What the stand-in ``kind`` returns for the input ``value`` (called from a rewritten region)."""
    if kind == "identity":
        return value
    if kind == "zeros":
        return _zeros(value)
    if kind == "rank0":
        return _from_rank0(comm, value)
    raise ValueError(f"unknown stand-in {kind!r}; expected one of {KINDS}")


def _zeros(value):
    if isinstance(value, np.ndarray):
        return np.zeros_like(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_zeros(v) for v in value)
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, float, np.number)):
        return type(value)(0)
    return None


def _from_rank0(comm, value):
    """Rank 0's arrays on every rank (sent one by one: a stand-in, not a collective to copy)."""
    arrays = value if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(a, np.ndarray) for a in arrays):
        return value
    if comm.rank == 0:
        for dst in range(1, comm.world_size):
            for a in arrays:
                comm.send(a, dst)
        return value
    got = [comm.recv(0, out=np.empty_like(a)) for a in arrays]
    return type(value)(got) if isinstance(value, (list, tuple)) else got[0]


def _parameters(text: str) -> dict[str, list[str]]:
    """{qualified function name: its parameter names} for every def in a file."""
    found: dict[str, list[str]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[prefix + child.name] = [a.arg for a in child.args.posonlyargs + child.args.args
                                              + child.args.kwonlyargs]
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, prefix + child.name + ".")

    visit(parse_python(text), "")
    return found


def standin_code(region: Region, parameters: list[str], kind: str) -> list[str]:
    """The lines that replace the region: a return of the stand-in's value."""
    value = next((p for p in parameters if p not in SKIPPED_PARAMETERS), "None")
    comm = "comm" if "comm" in parameters else "None"
    return [f"{region.indent}from minidist_course.standins import stand_in as _stand_in",
            f"{region.indent}return _stand_in({kind!r}, {value}, {comm})"]


def takes_comm(root: Path) -> set[str]:
    """The exercises whose regions all sit in functions that take ``comm`` (rank0 applies to them)."""
    result: dict[str, bool] = {}
    for region in all_regions(root):
        params = _parameters((Path(root) / region.path).read_text())[region.function]
        result[region.exercise] = result.get(region.exercise, True) and "comm" in params
    return {ex for ex, ok in result.items() if ok}


def write_standin_copy(root: Path, dest: Path, kind: str) -> None:
    """A copy of the reference at dest with every region replaced by the stand-in ``kind``."""
    copy_tree(root, dest)
    parameters = functools.cache(lambda rel: _parameters((Path(root) / rel).read_text()))
    rewrite_files(root, dest, all_regions(root),
                  lambda r, lines: standin_code(r, parameters(r.path)[r.function], kind),
                  cut_trailing=lambda r: True)


def grade_standins(root: Path, jobs: int = 2, timeout: float = 30.0, every_test: bool = False,
                   exercises: list[str] | None = None,
                   echo=print) -> dict[tuple[str, str], tuple[int, int, list[str]]]:
    """{(kind, exercise): (passed, run, ids of the passing tests)} for every stand-in of every exercise.

    every_test: also run the tests already recorded as passing on a stand-in (to measure them anew)."""
    jobs, timeout = check_count(jobs, "jobs"), check_real(timeout, "timeout", 0, strict=True)
    root = Path(root).resolve()
    ids = exercises or sorted({r.exercise for r in all_regions(root)})
    with_comm = takes_comm(root)
    pairs = [(k, ex) for k in KINDS for ex in ids if k != "rank0" or ex in with_comm]
    old = os.environ.get("MINIDIST_ALL_REACHING_TESTS")
    if every_test:
        os.environ["MINIDIST_ALL_REACHING_TESTS"] = "1"     # read by tests/conftest.py in the sessions
    try:
        ref = Reference.read(root)
        with tempfile.TemporaryDirectory(prefix="minidist-standins-") as tmp:
            for kind in KINDS:
                write_standin_copy(root, Path(tmp) / kind, kind)

            def one(pair):
                kind, ex = pair
                work = Path(tmp) / "work" / f"{kind}-{ex}"
                work.mkdir(parents=True)
                tests = run_job(Job(Path(tmp) / kind, ex, [ex]), ref, work, None, timeout, 300.0)[0]
                run = [t for t in tests if t.outcome != "skipped"]
                passing = sorted(t.id for t in run if t.outcome == "passed")
                echo(f"{kind:9s} {ex:28s} {len(passing):3d}/{len(run):<3d} own tests pass")
                return pair, (len(passing), len(run), passing)

            with ThreadPoolExecutor(max_workers=jobs) as pool:
                return dict(pool.map(one, pairs))
    finally:
        if every_test:
            if old is None:
                del os.environ["MINIDIST_ALL_REACHING_TESTS"]
            else:
                os.environ["MINIDIST_ALL_REACHING_TESTS"] = old


def write_standin_tests(root: Path, results: dict) -> dict[str, list[str]]:
    """Record {exercise: tests that pass on one of its stand-ins} in tests/exercise_standins.json."""
    weak: dict[str, set[str]] = {}
    for (_kind, ex), (_p, _r, passing) in results.items():
        if passing:
            weak.setdefault(ex, set()).update(passing)
    data = {ex: sorted(tests) for ex, tests in sorted(weak.items())}
    (Path(root) / STANDINS_PATH).write_text(json.dumps(data, indent=1) + "\n")
    return data


def problems(results: dict) -> list[str]:
    """Stand-ins that score more than MAX_SCORE, and exercises left without an own test."""
    found = []
    for (kind, ex), (passed, run, _tests) in sorted(results.items()):
        if run == 0 and kind == "identity":
            found.append(f"{ex}: no own test left (every test reaching it passes on a stand-in)")
        elif run and passed / run > MAX_SCORE:
            found.append(f"{ex}: the {kind} stand-in passes {passed}/{run} own tests (> {MAX_SCORE:.0%})")
    return found
