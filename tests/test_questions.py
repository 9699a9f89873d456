"""The check-yourself questions (issue 55 item 6): three to five for each of lessons 05, 06, 08, 09, 14, 17
and 19; each lesson's last cell computes every answer and `check_yourself` asserts it against the key;
`exercises questions` prints them as a handout (answers only with --answers); the book ends each lesson's
page with them and lists the answers on answers.html (the pure parts, tested here without jupytext)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from minidist.__main__ import main
from minidist_course import book, questions
from minidist_course.questions import QUESTIONS, check_yourself, format_answer

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ("05", "06", "08", "09", "14", "17", "19")


def lesson_path(number: str) -> Path:
    (path,) = (ROOT / "lessons").glob(f"{number}_*.py")
    return path


def checked_ids(number: str) -> list[list[str]]:
    """The keywords of every check_yourself("NN", ...) call in the lesson's source."""
    calls = [node for node in ast.walk(ast.parse(lesson_path(number).read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check_yourself"]
    return [[kw.arg for kw in call.keywords] for call in calls
            if call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value == number]


def test_questions_exist_for_the_seven_lessons_three_to_five_each():
    assert sorted(QUESTIONS) == list(LESSONS)
    for number, qs in QUESTIONS.items():
        assert 3 <= len(qs) <= 5, (number, len(qs))
        assert len({q.id for q in qs}) == len(qs), number
        assert all(q.text.endswith("?") or "?" in q.text for q in qs), number
        assert all(q.why and q.answer is not None for q in qs), number


@pytest.mark.parametrize("number", LESSONS)
def test_each_lesson_asserts_every_answer_once_in_its_last_code_cell(number):
    calls = checked_ids(number)
    assert len(calls) == 1, f"lesson {number}: expected one check_yourself call, found {len(calls)}"
    assert sorted(calls[0]) == sorted(q.id for q in QUESTIONS[number])
    source = lesson_path(number).read_text()
    last_code_cell = source[source.rindex("\n# %%\n"):]
    assert "check_yourself(" in last_code_cell, f"lesson {number}: the check is not in the last code cell"


def test_the_key_passes_silently_and_prints_no_answer(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lesson.py"])
    for number, qs in QUESTIONS.items():
        check_yourself(number, **{q.id: q.answer for q in qs})
    out = capsys.readouterr().out
    assert out.count("check yourself: ") == len(QUESTIONS)
    assert "Answer:" not in out and "20,000,000" not in out


def test_answers_flag_prints_the_answers(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lesson.py", "--answers"])
    check_yourself("05", **{q.id: q.answer for q in QUESTIONS["05"]})
    out = capsys.readouterr().out
    assert "Answer: 20,000,000." in out and "Answer: 32,768." in out


def test_a_wrong_answer_fails_naming_the_question_and_bad_ids_are_refused(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lesson.py"])
    key = {q.id: q.answer for q in QUESTIONS["08"]}
    wrong = r"check yourself 08\.held_at_stage_2: the lesson computes \(12, 3\)"
    with pytest.raises(AssertionError, match=wrong):
        check_yourself("08", **{**key, "held_at_stage_2": (12, 3)})
    with pytest.raises(AssertionError, match=r"08\.gpipe_bubble"):
        check_yourself("08", **{**key, "gpipe_bubble": 5 / 17 * (1 + 1e-6)})
    with pytest.raises(ValueError, match="expected an answer for each of"):
        check_yourself("08", gpipe_bubble=5 / 17)
    with pytest.raises(ValueError, match="expected an answer for each of"):
        check_yourself("08", **key, extra=1)
    with pytest.raises(ValueError, match="no questions for '07'"):
        check_yourself("07")


def test_answers_are_formatted_as_a_reader_writes_them():
    assert format_answer(20_000_000) == "20,000,000"
    assert format_answer(3 / 11) == "0.2727"
    assert format_answer(("ZeRO-1", 31.40625)) == "ZeRO-1, 31.41"


def test_the_handout_command_prints_questions_and_answers_only_on_request(capsys):
    assert main(["exercises", "questions", "--lesson", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Lesson 08: check yourself") and "Answer:" not in out
    assert len(re.findall(r"^  \d\. ", out, re.M)) == 3
    assert main(["exercises", "questions", "--answers"]) == 0
    out = capsys.readouterr().out
    assert [f"Lesson {n}: check yourself" in out for n in LESSONS] == [True] * 7
    assert out.count("Answer: ") == sum(map(len, QUESTIONS.values()))
    assert main(["exercises", "questions", "--lesson", "07"]) == 2
    assert "no questions for lesson '07'" in capsys.readouterr().err


def test_the_book_ends_each_lesson_with_its_questions_and_lists_the_answers():
    md = questions.questions_markdown("14")
    assert md.startswith("## Check yourself") and md.count("\n1. ") + md.count("\n2. ") == 2
    assert "answers.html#lesson-14" in md and "2.219" not in md
    assert questions.questions_markdown("07") == ""
    page = questions.answers_page(["05", "07", "14"], book.GENERATOR)
    assert book.GENERATOR in page and 'id="lesson-05"' in page and 'id="lesson-14"' in page
    assert "lesson-07" not in page and "<b>20,000,000</b>" in page and "<b>ZeRO-1, 31.41</b>" in page
    assert 'href="answers.html"' in book.index_page([])


def test_the_book_refuses_to_overwrite_an_answers_page_it_did_not_write(tmp_path):
    (tmp_path / "answers.html").write_text("mine")
    with pytest.raises(ValueError, match="answers.html"):
        book.build_book(tmp_path, only=["05"])


def test_the_book_appends_the_questions_as_the_last_markdown_cell():
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    book.end_with_questions(notebook, "07")
    assert len(notebook.cells) == 1                                   # lesson 07 has no questions
    book.end_with_questions(notebook, "17")
    assert notebook.cells[-1].cell_type == "markdown"
    assert notebook.cells[-1].source == questions.questions_markdown("17")
