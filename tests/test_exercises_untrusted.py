"""Submissions and options the course tooling must not trust (issue 58, items 2, 3 and 9): a submission's
files are read only inside it (a link to the reference or a classmate's copy, a folder or a FIFO where a
file belongs, bytes that are not text: that exercise scores 0 with a one-line reason, the class is still
graded); an empty or blank --only is an error of every command; `book OUT` refuses in one line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minidist.__main__ import main
from minidist_course import grade_class, make_student_copy, splice_functions
from minidist_course.grade import submission_text
from tests.test_exercises_catalog import MADE_BY_THE_TOOLING
from tests.test_exercises_tooling import TOY, toy_repo  # noqa: F401  (the fixture)

TOY_FILE = "minidist/toy.py"


def test_submission_text_reads_only_inside_the_submission(tmp_path):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "answer.py").write_text("solved")
    sub = tmp_path / "sub"
    (sub / "pkg").mkdir(parents=True)
    (sub / "pkg" / "own.py").write_text("mine")
    (sub / "pkg" / "alias.py").symlink_to("own.py")                     # a link inside: it is theirs
    (sub / "pkg" / "out.py").symlink_to(tmp_path / "theirs" / "answer.py")
    (sub / "pkg" / "relative.py").symlink_to("../../theirs/answer.py")    # a classmate's copy
    (sub / "linked").symlink_to(tmp_path / "theirs")                      # a folder on the path leads out
    (sub / "pkg" / "folder.py").mkdir()
    os.mkfifo(sub / "pkg" / "fifo.py")                                    # reading would block forever
    (sub / "pkg" / "binary.py").write_bytes(b"\xff\xfe\x00bad")
    (sub / "pkg" / "dangling.py").symlink_to(tmp_path / "nowhere.py")
    assert submission_text(sub, "pkg/own.py") == submission_text(sub, "pkg/alias.py") == "mine"
    for path, reason in [("pkg/out.py", "leads out of the submission"),
                         ("pkg/relative.py", "leads out of the submission"),
                         ("linked/answer.py", "leads out of the submission"),
                         ("pkg/folder.py", "not a file"), ("pkg/fifo.py", "not a file"),
                         ("pkg/binary.py", "cannot be read"), ("pkg/dangling.py", "has no pkg/dangling.py"),
                         ("pkg/absent.py", "has no pkg/absent.py")]:
        with pytest.raises(ValueError, match=reason) as caught:
            submission_text(sub, path)
        assert "\n" not in str(caught.value), path


@pytest.mark.slow
def test_a_link_out_or_a_folder_scores_zero_and_the_rest_of_the_class_is_graded(toy_repo, tmp_path):  # noqa: F811
    students = {}
    for name in ("linked", "folder", "honest"):
        make_student_copy(toy_repo, tmp_path / name)
        students[name] = tmp_path / name
    (students["linked"] / TOY_FILE).unlink()
    (students["linked"] / TOY_FILE).symlink_to(toy_repo / TOY_FILE)       # the instructor's solution
    (students["folder"] / TOY_FILE).unlink()
    (students["folder"] / TOY_FILE).mkdir()
    toy = students["honest"] / TOY_FILE
    toy.write_text(splice_functions(toy.read_text(), TOY, {"add"}))        # solves toy_add only
    linked, folder, honest = grade_class(list(students.values()), toy_repo)
    for report, reason in [(linked, "leads out of the submission"), (folder, "not a file")]:
        assert [r.score for r in report.exercises] == [0.0, 0.0]
        assert all(reason in r.error and "\n" not in r.error for r in report.exercises), report.exercises
    assert [r.score for r in honest.exercises] == [1.0, 0.0] and honest.status == "graded"


@pytest.mark.skipif(MADE_BY_THE_TOOLING, reason="a student copy's CLI refuses these verbs before --only")
@pytest.mark.parametrize("verb", [["make", "DEST"], ["mutants"], ["check"], ["grade", "SUB"],
                                  ["autograder", "OUT.zip"]])
@pytest.mark.parametrize("only", ["", ",", " , "])
def test_an_empty_or_blank_only_is_an_error_of_every_command(verb, only, tmp_path, capsys):
    args = [str(tmp_path / a) if a.isupper() else a for a in verb]
    assert main(["exercises", *args, "--only", only]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--only" in err[0] and "expected one or more exercise ids" in err[0], err
    assert not any(tmp_path.iterdir())                                    # nothing was written


def test_the_python_api_refuses_an_empty_selection_too(toy_repo, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match=r"only=\[\]"):
        make_student_copy(toy_repo, tmp_path / "copy", only=[])
    assert not (tmp_path / "copy").exists()
    with pytest.raises(ValueError, match=r"exercises=\[\]"):
        grade_class([toy_repo], toy_repo, exercises=[])


@pytest.mark.parametrize("make", ["under a file", "a dangling link", "a file", "a link to a file"])
def test_book_out_that_cannot_be_a_folder_is_one_line_and_exit_2(make, tmp_path):
    (tmp_path / "plain").write_text("the user's file")
    out = {"under a file": tmp_path / "plain" / "site", "a dangling link": tmp_path / "dangling",
           "a file": tmp_path / "plain", "a link to a file": tmp_path / "link"}[make]
    if make == "a dangling link":
        out.symlink_to(tmp_path / "nowhere")
    if make == "a link to a file":
        out.symlink_to(tmp_path / "plain")
    done = subprocess.run([sys.executable, "-m", "minidist", "book", str(out), "--only", "01"],
                          capture_output=True, text=True, check=False,
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m minidist book: error: OUT"), done.stderr
    assert (tmp_path / "plain").read_text() == "the user's file" and not (tmp_path / "nowhere").exists()
