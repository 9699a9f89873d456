"""The book: lessons found by glob, figures shown inline in a kernel, and (with the [notebook] extra) one
lesson executed into a page that holds every figure it wrote."""

from pathlib import Path

import pytest

from minidist import plots
from minidist.book import EMBEDDED_PNG, build_book, lessons, title

ROOT = Path(__file__).resolve().parent.parent


def test_lessons_are_found_by_glob_and_titled():
    found = lessons(ROOT)
    assert found == sorted(found) and all(p.name[:2].isdigit() for p in found) and len(found) >= 15
    assert [p.name for p in lessons(ROOT, only=["2"])] == ["02_optimizers.py"]
    assert title(ROOT / "lessons" / "02_optimizers.py").startswith("02")


def test_a_script_writes_figures_without_trying_to_show_them(tmp_path):
    assert plots.show_inline(tmp_path / "absent.png") is False      # no kernel here: files only


@pytest.mark.slow
def test_a_lesson_page_holds_every_figure_the_lesson_wrote(tmp_path):
    pytest.importorskip("jupytext")
    pytest.importorskip("nbclient")
    pytest.importorskip("nbconvert")
    pytest.importorskip("ipykernel")
    committed = {p: p.stat().st_mtime_ns for p in (ROOT / "figures").glob("02_*.png")}
    lines = []
    [page] = build_book(tmp_path, only=["02"], root=ROOT, echo=lines.append)
    text = page.read_text()
    assert text.count(EMBEDDED_PNG) >= 1 and "4 figures written, 4 shown" in lines[0], lines
    assert "02_optimizers.html" in (tmp_path / "index.html").read_text()
    assert {p: p.stat().st_mtime_ns for p in committed} == committed     # figures/ left alone
