"""The exercise tooling on a toy repository: markers, student copy, the test map, grading."""

import ast
import json
import shutil
from pathlib import Path

import pytest

from minidist_course import (
    MarkerError,
    all_regions,
    build_map,
    find_regions,
    grade,
    grade_class,
    grade_submission,
    make_student_copy,
    read_registry,
    splice_functions,
)
from minidist_course.tree import cut_lines, rewrite_regions

CONFTEST = Path(__file__).resolve().parent / "conftest.py"

TOY = '''\
def add(a, b):
    """Return a + b."""
    # BEGIN SOLUTION toy_add
    # BEGIN PROMPT
    # Hint: Python has an operator for this.
    # END PROMPT
    return a + b
    # END SOLUTION


class Box:
    def scale(self, x):
        """Twice x."""
        y = 0
        if x is not None:
            # BEGIN SOLUTION toy_scale
            y = 2 * x
            # END SOLUTION
        return y


def untouched():
    """Mentions '# BEGIN SOLUTION' inside a string, which is not a marker."""
    return 1
'''

TESTS = '''\
from minidist.toy import Box, add, untouched


def test_add():
    assert add(2, 3) == 5


def test_scale():
    assert Box().scale(4) == 8


def test_both():
    assert add(Box().scale(1), 1) == 3


def test_plain():
    assert untouched() == 1
'''

REGISTRY = '''\
from minidist_course.registry import Exercise

EXERCISES = (Exercise("toy_add", "lessons/01_toy.py", "add two numbers"),
             Exercise("toy_scale", "lessons/01_toy.py", "double a number", "multiply"))
'''
README = "# toy\n\n## Exercises\n\nThe reference code holds the solutions.\n\n## Layout\n\nsmall\n"


def write_toy_repo(root: Path, toy: str = TOY) -> Path:
    (root / "minidist").mkdir(parents=True)
    (root / "minidist" / "__init__.py").write_text("")
    (root / "minidist" / "toy.py").write_text(toy)
    (root / "minidist_course").mkdir()
    (root / "minidist_course" / "registry.py").write_text(REGISTRY)
    (root / "lessons").mkdir()
    (root / "lessons" / "TEACHING.md").write_text("for instructors\n")
    (root / "README.md").write_text(README)
    (root / "tests").mkdir()
    (root / "tests" / "__init__.py").write_text("")
    shutil.copy(CONFTEST, root / "tests" / "conftest.py")
    shutil.copy(CONFTEST.with_name("student_mode.py"), root / "tests" / "student_mode.py")
    (root / "tests" / "test_toy.py").write_text(TESTS)
    return root


@pytest.fixture(scope="module")
def toy_repo(tmp_path_factory):
    root = write_toy_repo(tmp_path_factory.mktemp("toy") / "repo")
    build_map(root)
    return root


def test_parser_finds_regions_prompts_and_functions():
    regions = find_regions(TOY, "minidist/toy.py")
    assert [(r.exercise, r.function) for r in regions] == [("toy_add", "add"), ("toy_scale", "Box.scale")]
    assert regions[0].prompt == ["    # Hint: Python has an operator for this."]
    assert regions[1].indent == " " * 12


def test_parser_names_the_innermost_function_of_nested_ones():
    text = ("class A:\n    def outer(self):\n        def inner(x):\n            # BEGIN SOLUTION e\n"
            "            return x\n            # END SOLUTION\n        return inner\n")
    [region] = find_regions(text, "x.py")
    assert (region.function, region.indent) == ("A.outer.inner", " " * 12)


@pytest.mark.parametrize("bad, message", [
    ("def f():\n    # BEGIN SOLUTION a\n    return 1\n", "never closed"),
    ("def f():\n    return 1\n    # END SOLUTION\n", "without a BEGIN"),
    ("def f():\n    # BEGIN SOLUTION a\n    # BEGIN SOLUTION b\n    x = 1\n    # END SOLUTION\n",
     "cannot nest"),
    ("def f():\n    # BEGIN SOLUTION a\n    x = 1\n        # END SOLUTION\n", "indented differently"),
    ("# BEGIN SOLUTION a\nx = 1\n# END SOLUTION\n", "not inside a function"),
    ("def f():\n    # BEGIN SOLUTION a\n    # BEGIN PROMPT\n    x = 1\n    # END SOLUTION\n", "PROMPT"),
    ("def f():\n    # BEGIN SOLUTION  \n    return 1\n", "malformed"),
])
def test_parser_rejects_malformed_markers(bad, message):
    with pytest.raises(MarkerError, match=message):
        find_regions(bad, "x.py")


def test_map_records_which_test_reaches_which_exercise(toy_repo):
    mapping = json.loads((toy_repo / "tests" / "exercise_map.json").read_text())
    assert mapping == {"tests/test_toy.py::test_add": ["toy_add"],
                       "tests/test_toy.py::test_both": ["toy_add", "toy_scale"],
                       "tests/test_toy.py::test_scale": ["toy_scale"]}


def test_student_copy_cuts_regions_keeps_docstrings_and_is_reproducible(toy_repo, tmp_path):
    make_student_copy(toy_repo, tmp_path / "a", hints="full")
    make_student_copy(toy_repo, tmp_path / "b", hints="full")
    text = (tmp_path / "a" / "minidist" / "toy.py").read_text()
    assert text == (tmp_path / "b" / "minidist" / "toy.py").read_text()
    ast.parse(text)
    assert "SOLUTION" not in text.replace("'# BEGIN SOLUTION'", "") and "PROMPT" not in text
    assert "return a + b" not in text and "y = 2 * x" not in text
    assert '    """Return a + b."""\n    # Exercise toy_add (lessons/01_toy.py): add two numbers\n' \
           "    # Hint: Python has an operator for this.\n" \
           "    raise NotImplementedError('exercise toy_add: see lessons/01_toy.py')" in text
    assert "            raise NotImplementedError('exercise toy_scale" in text


HINTS_AT = {   # what the cut toy_scale region holds at each level (its exercise has an idea, no prompt)
    "none": "            raise NotImplementedError",
    "outline": "            # Exercise toy_scale (lessons/01_toy.py): double a number\n"
               "            # Idea: multiply\n            raise NotImplementedError",
}


@pytest.mark.slow
def test_hint_levels_keep_the_docstring_add_steps_and_change_no_grade(toy_repo, tmp_path):
    texts, copies = {}, []
    for level in ("none", "outline", "full"):
        make_student_copy(toy_repo, tmp_path / level, hints=level)
        toy = tmp_path / level / "minidist" / "toy.py"
        texts[level] = toy.read_text()
        assert json.loads((tmp_path / level / ".minidist-student.json").read_text())["hints"] == level
        tree = ast.parse(texts[level])                      # the contract stays at every level
        add = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "add")
        assert ast.get_docstring(add) == "Return a + b."
        toy.write_text(splice_functions(texts[level], TOY, {"add"}))          # solve toy_add alone
        copies.append(tmp_path / level)
    assert '"""Return a + b."""\n    raise NotImplementedError' in texts["none"] and "#" not in \
        texts["none"].split("def scale")[1].split("return y")[0]
    for level, expected in HINTS_AT.items():
        assert expected in texts[level], level
    assert "Hint: Python has an operator" in texts["full"] and "Hint:" not in texts["outline"]
    assert "Exercise toy_add (lessons/01_toy.py): add two numbers" in texts["outline"]
    with pytest.raises(ValueError, match="hints='some'"):
        make_student_copy(toy_repo, tmp_path / "x", hints="some")
    assert not (tmp_path / "x").exists()
    scores = [[r.score for r in report.exercises] for report in grade_class(copies, toy_repo)]
    assert scores == [[1.0, 0.0]] * 3


def test_student_copy_only_keeps_other_solutions_without_markers(toy_repo, tmp_path):
    make_student_copy(toy_repo, tmp_path / "s", only=["toy_scale"])
    text = (tmp_path / "s" / "minidist" / "toy.py").read_text()
    assert "    return a + b\n" in text and "Hint" not in text and "BEGIN PROMPT" not in text
    assert "exercise toy_scale" in text
    with pytest.raises(MarkerError, match="unknown exercise"):
        make_student_copy(toy_repo, tmp_path / "t", only=["nope"])


def test_a_region_no_test_reaches_is_an_error(tmp_path):
    root = write_toy_repo(tmp_path / "repo")
    (root / "tests" / "exercise_map.json").write_text(
        json.dumps({"tests/test_toy.py::test_add": ["toy_add"]}))
    with pytest.raises(MarkerError, match=r"no test reaches exercise\(s\) \['toy_scale'\]"):
        make_student_copy(root, tmp_path / "out")


def test_an_exercise_registered_twice_is_an_error(tmp_path):
    root = write_toy_repo(tmp_path / "repo")
    registry = root / "minidist_course" / "registry.py"
    registry.write_text(REGISTRY.replace('"double a number", "multiply"))',
                                         '"double a number", "multiply"),\n'
                                         '             Exercise("toy_add", "lessons/01_toy.py", "again"))'))
    with pytest.raises(MarkerError, match="exercise 'toy_add' is registered twice"):
        read_registry(root)


def test_splice_replaces_only_the_named_functions():
    student = TOY.replace("return a + b", "return b + a").replace("y = 2 * x", "y = x + x")
    merged = splice_functions(TOY, student, {"add"})
    assert "return b + a" in merged and "y = 2 * x" in merged
    with pytest.raises(ValueError, match="lacks"):
        splice_functions(TOY, "def other():\n    pass\n", {"add"})


@pytest.mark.slow
def test_grade_round_trip(toy_repo, tmp_path):
    """Student copy + one solution put back: that exercise scores full marks, the other zero;
    a wrong solution scores below full marks."""
    student = tmp_path / "student"
    make_student_copy(toy_repo, student)
    toy_file = student / "minidist" / "toy.py"
    solved = splice_functions(toy_file.read_text(), TOY, {"add"})
    toy_file.write_text(solved)
    report = grade_submission(student, toy_repo, integration=True)
    scores = {r.exercise: (r.passed, r.total) for r in report.exercises}
    assert scores == {"toy_add": (1, 1), "toy_scale": (0, 1)}      # own tests only
    [both] = report.integration
    assert (both.name, both.passed, both.total) == ("toy_add + toy_scale", 0, 1)
    [failure] = report.exercises[1].failing
    assert failure["test"] == "tests/test_toy.py::test_scale"
    assert "NotImplementedError: exercise toy_scale: see lessons/01_toy.py" in failure["message"]

    toy_file.write_text(solved.replace("return a + b", "return a - b"))
    wrong = {r.exercise: r.score for r in grade(student, toy_repo, exercises=["toy_add"])}
    assert wrong["toy_add"] < 1.0


@pytest.mark.slow
def test_grade_runs_hidden_tests(toy_repo, tmp_path):
    student = tmp_path / "student"
    make_student_copy(toy_repo, student, only=["toy_scale"])
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "test_hidden_toy.py").write_text(
        "import pytest\nfrom minidist.toy import add\n\n"
        "@pytest.mark.exercise('toy_add')\ndef test_negative():\n    assert add(-1, -1) == -2\n")
    [result] = grade(student, toy_repo, exercises=["toy_add"], hidden=hidden)
    assert (result.passed, result.total) == (2, 2)     # test_add and the hidden test_negative


def test_a_cut_leaves_nothing_after_the_raise_in_its_block():
    text = ("def f(x):\n    y = 0\n    if x:\n        # BEGIN SOLUTION a\n        y = x\n"
            "        # END SOLUTION\n"
            "    # BEGIN SOLUTION a\n    z = y + 1\n    # END SOLUTION\n    # the result\n    return (z,\n"
            "            y)\n\n\ndef g():\n    return 2\n")
    regions = find_regions(text, "x.py")
    out = rewrite_regions(text, regions, lambda r, lines: cut_lines(r, "lessons/x.py"),
                          cut_trailing=lambda r: True)
    assert out == ("def f(x):\n    y = 0\n    if x:\n"
                   "        raise NotImplementedError('exercise a: see lessons/x.py')\n"
                   "    raise NotImplementedError('exercise a: see lessons/x.py')\n"
                   "\n\ndef g():\n    return 2\n")


def test_student_copy_gets_a_readme_for_students_and_no_instructor_guide(toy_repo, tmp_path):
    make_student_copy(toy_repo, tmp_path / "s", only=["toy_scale"])
    readme = (tmp_path / "s" / "README.md").read_text()
    assert "reference code holds" not in readme and "## Exercises (your work)" in readme
    assert ("| `toy_scale` | `lessons/01_toy.py` | minidist/toy.py: Box.scale | double a number | multiply |"
            in readme)
    assert "toy_add" not in readme.split("## Layout")[0].split("| id |")[1].split("Check one")[0]
    assert "python -m pytest --exercise" in readme and "python -m minidist run" in readme
    assert readme.endswith("## Layout\n\nsmall\n")
    assert not (tmp_path / "s" / "lessons" / "TEACHING.md").exists()


REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not find_regions((REPO / "minidist" / "optim" / "adam.py").read_text(), "adam.py"),
                    reason="a student copy has no regions (its functions keep the docstrings checked here)")
def test_every_function_that_holds_an_exercise_states_its_contract_in_a_docstring():
    """`exercises make --hints none` leaves a cut function its signature and docstring only."""
    lacking = []
    for region in all_regions(REPO):
        node = ast.parse((REPO / region.path).read_text())
        for name in region.function.split("."):
            node = next(n for n in ast.iter_child_nodes(node) if getattr(n, "name", None) == name)
        if len(ast.get_docstring(node) or "") < 20:
            lacking.append(f"{region.path}: {region.function}")
    assert not lacking, f"exercise functions without a docstring stating the contract: {lacking}"
