"""The Gradescope autograder (`exercises autograder OUT.zip`): the zip holds setup.sh and run_autograder at
its root and the reference; unpacked into a Gradescope-like tree (its root given to run_autograder instead
of /autograder), it grades a solved, a blank, a broken and a refused submission into results.json files
that follow Gradescope's documented schema and give the scores `exercises grade` gives."""

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from minidist.__main__ import main
from minidist_course import grade_class, make_student_copy
from minidist_course.gradescope import find_copy, results_json
from minidist_course.markers import all_regions
from tests.test_exercises_catalog import MADE_BY_THE_TOOLING

ROOT = Path(__file__).resolve().parent.parent
IDS = ["error_feedback", "stale_synchronous_bound"]          # two exercises with few, quick own tests
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}   # Gradescope's documented values


def check_schema(results: dict) -> None:
    """Gradescope's results.json (Autograder Specifications): score, tests[] of name, score, max_score,
    output, visibility; our additions: max_score, the scores adding up."""
    assert isinstance(results["score"], float) and isinstance(results["max_score"], float)
    assert isinstance(results["output"], str) and results["visibility"] in VISIBILITY
    assert isinstance(results["tests"], list) and results["tests"]
    for test in results["tests"]:
        assert set(test) == {"name", "score", "max_score", "output", "visibility"}, test
        assert isinstance(test["name"], str) and isinstance(test["output"], str) and test["output"]
        assert 0.0 <= test["score"] <= test["max_score"] and test["visibility"] in VISIBILITY
    assert results["score"] == pytest.approx(sum(t["score"] for t in results["tests"]))
    assert results["max_score"] == sum(t["max_score"] for t in results["tests"])


def submissions(tmp_path: Path) -> dict[str, Path]:
    """blank: the student copy; solved: the reference's files put back; broken: one file that does not
    parse, the other solved; refused: not a copy of the course at all."""
    paths = sorted({r.path for r in all_regions(ROOT) if r.exercise in IDS})
    blank = tmp_path / "blank"
    make_student_copy(ROOT, blank, only=IDS)
    solved, broken = tmp_path / "solved", tmp_path / "broken"
    shutil.copytree(blank, solved, symlinks=True)
    for path in paths:
        shutil.copy(ROOT / path, solved / path)
    shutil.copytree(solved, broken, symlinks=True)
    [error_file] = {r.path for r in all_regions(ROOT) if r.exercise == "error_feedback"}
    (broken / error_file).write_text((broken / error_file).read_text() + "\ndef oops(:\n")
    refused = tmp_path / "refused"
    (refused / "notes").mkdir(parents=True)
    return {"solved": solved, "blank": blank, "broken": broken, "refused": refused}


@pytest.mark.skipif(MADE_BY_THE_TOOLING, reason="a student copy has no reference to grade with")
@pytest.mark.slow
def test_the_autograder_zip_grades_as_exercises_grade_does(tmp_path, capsys):
    archive = tmp_path / "autograder.zip"
    assert main(["exercises", "autograder", str(archive), "--only", ",".join(IDS)]) == 0
    first = archive.read_bytes()
    assert main(["exercises", "autograder", str(archive), "--only", ",".join(IDS)]) == 0   # rewrites ours
    assert archive.read_bytes() == first                                    # the same tree, the same bytes
    (tmp_path / "mine.zip").write_text("the user's")
    assert main(["exercises", "autograder", str(tmp_path / "mine.zip")]) == 2   # never overwrites theirs
    assert main(["exercises", "autograder", str(tmp_path / "out.tar")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "not an autograder zip" in err[0] and "ending in .zip" in err[1], err

    gradescope = tmp_path / "autograder"                  # Gradescope unpacks the zip into source/
    with zipfile.ZipFile(archive) as zipped:
        names = zipped.namelist()
        assert {"setup.sh", "run_autograder", "minidist/__init__.py", "tests/exercise_map.json",
                "pyproject.toml"} <= set(names)
        for script in ("setup.sh", "run_autograder"):
            assert zipped.getinfo(script).external_attr >> 16 & stat.S_IXUSR
        zipped.extractall(gradescope / "source")
    for script in ("setup.sh", "run_autograder"):
        subprocess.run(["bash", "-n", str(gradescope / "source" / script)], check=True)   # both parse
    assert "pip install -e \"/autograder/source[test]\"" in (gradescope / "source" / "setup.sh").read_text()

    found = {}
    for name, submission in submissions(tmp_path).items():
        shutil.rmtree(gradescope / "submission", ignore_errors=True)
        shutil.copytree(submission, gradescope / "submission", symlinks=True)
        done = subprocess.run(["bash", str(gradescope / "source" / "run_autograder"), str(gradescope)],
                              capture_output=True, text=True, check=False, timeout=300,
                              env=dict(os.environ, MINIDIST_PYTHON=sys.executable))
        assert done.returncode == 0, done.stderr[-2000:]
        found[name] = json.loads((gradescope / "results" / "results.json").read_text())
        check_schema(found[name])

    reports = grade_class([tmp_path / n for n in ("solved", "blank", "broken")], ROOT, exercises=IDS)
    for name, report in zip(("solved", "blank", "broken"), reports, strict=True):
        results = found[name]
        assert [(t["name"], t["score"], t["max_score"]) for t in results["tests"]] == [
            (r.exercise, r.score, 1.0) for r in report.exercises], name
        assert results["score"] == pytest.approx(report.total_score * len(IDS))
        assert {k: v for k, v in results.items() if k not in ("output", "execution_time")} == {
            k: v for k, v in results_json(report).items() if k not in ("output", "execution_time")}
    assert found["solved"]["score"] == 2.0 and found["blank"]["score"] == 0.0
    broken = {t["name"]: t for t in found["broken"]["tests"]}
    assert broken["error_feedback"]["score"] == 0.0 and "code not taken" in broken["error_feedback"]["output"]
    assert broken["stale_synchronous_bound"]["score"] == 1.0
    assert all("not solved yet" in t["output"] for t in found["blank"]["tests"])
    refused = found["refused"]
    assert refused["score"] == 0.0 and refused["max_score"] == 2.0 and "not a copy of the course" in \
        refused["output"] and [t["name"] for t in refused["tests"]] == IDS


def test_a_copy_uploaded_as_a_zip_of_its_folder_is_found_one_level_down(tmp_path):
    upload = tmp_path / "submission"
    (upload / "week4-ada" / "minidist").mkdir(parents=True)
    (upload / "week4-ada" / "minidist" / "__init__.py").write_text("")
    (upload / "__MACOSX").mkdir()                                  # what macOS's zip adds beside it
    assert find_copy(upload) == upload / "week4-ada"
    (upload / "other").mkdir()                                     # two candidates: no guess
    assert find_copy(upload) == upload
    assert find_copy(upload / "week4-ada") == upload / "week4-ada"
