"""lessons/EXERCISES.md is current, the exercise modules import without cycles, and in a student copy every
entry point stops on an unsolved exercise with the friendly message, not a traceback."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minidist_course import make_student_copy, read_registry, render_markdown
from minidist_course.catalog import with_week_table
from minidist_course.student_copy import HITS_MODULE, STUDENT_STAMP
from minidist_course.unsolved import unsolved_exercise

ROOT = Path(__file__).resolve().parent.parent
MADE_BY_THE_TOOLING = (ROOT / STUDENT_STAMP).exists() or (ROOT / f"{HITS_MODULE}.py").exists()
FRIENDLY = "stops here: it needs exercise linear, which is not solved yet in this copy."


@pytest.mark.skipif(MADE_BY_THE_TOOLING, reason="a student or instrumented copy has no markers to list")
def test_exercises_md_is_generated_from_the_registry_and_the_markers():
    current = (ROOT / "lessons" / "EXERCISES.md").read_text()
    assert current == render_markdown(ROOT), (
        "lessons/EXERCISES.md is stale: run "
        "`python -m minidist exercises list --markdown > lessons/EXERCISES.md`")


@pytest.mark.skipif(MADE_BY_THE_TOOLING, reason="a student or instrumented copy has no TEACHING.md to check")
def test_teaching_week_table_is_generated_from_the_registry():
    current = (ROOT / "lessons" / "TEACHING.md").read_text()
    assert current == with_week_table(current, read_registry(ROOT)), (
        "lessons/TEACHING.md's week table is stale: replace it by "
        "`python -m minidist exercises list --weeks`")
    assert all(f"`{ex}`" in current for ex in read_registry(ROOT))


@pytest.mark.skipif(MADE_BY_THE_TOOLING, reason="made from the reference tree only")
@pytest.mark.parametrize("verb", [["check"], ["grade", "."], ["make", "elsewhere"], ["map"], ["standins"],
                                  ["list", "--markdown"]])
def test_in_a_student_copy_every_exercises_verb_says_why_it_cannot_run(tmp_path_factory, verb):
    student = tmp_path_factory.getbasetemp() / "verbs-student"
    if not student.exists():
        make_student_copy(ROOT, student, only=["linear"])
    done = subprocess.run([sys.executable, "-m", "minidist", "exercises", *verb], cwd=student,
                          capture_output=True, text=True, timeout=120, check=False,
                          env=dict(os.environ, PYTHONPATH=str(student), MPLBACKEND="Agg"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "student copy" in done.stderr or "lessons/EXERCISES.md is the list" in done.stderr, done.stderr


def test_the_exercise_modules_import_each_other_without_a_cycle():
    folder = ROOT / "minidist_course"
    graph = {}
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text())
        graph[path.stem] = {node.module for node in ast.walk(tree)
                            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}
    done, active = set(), []

    def visit(name):
        assert name not in active, f"import cycle: {' -> '.join(active + [name])}"
        if name in done:
            return
        active.append(name)
        for dep in graph.get(name, ()):
            visit(dep)
        active.pop()
        done.add(name)

    for name in graph:
        if name != "__init__":
            visit(name)


def test_unsolved_exercise_is_found_in_the_error_or_in_a_rank_traceback():
    cut = NotImplementedError("exercise linear: see lessons/01_backprop.py")
    assert unsolved_exercise(cut) == "exercise linear"
    carried = RuntimeError("rank 1 raised:\nTraceback\nNotImplementedError: exercise ring_allreduce: see x")
    assert unsolved_exercise(carried) == "exercise ring_allreduce"
    assert unsolved_exercise(NotImplementedError("something else")) is None
    assert unsolved_exercise(ValueError("exercise linear: no")) is None


@pytest.mark.slow
@pytest.mark.skipif(MADE_BY_THE_TOOLING, reason="made from the reference tree only")
@pytest.mark.parametrize("command", [["-m", "minidist", "run", "01"], ["-m", "minidist", "demo"],
                                     ["lessons/01_backprop.py"]])
def test_every_entry_point_stops_kindly_on_an_unsolved_exercise(tmp_path_factory, command):
    student = tmp_path_factory.getbasetemp() / "entry-points-student"
    if not student.exists():
        make_student_copy(ROOT, student)
    done = subprocess.run([sys.executable, *command], cwd=student, capture_output=True, text=True,
                          check=False, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(student), MPLBACKEND="Agg"))
    assert done.returncode == 1 and FRIENDLY in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert "python -m pytest --exercise linear" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
