"""The book: lessons found by glob, figures shown inline in a kernel, maths found by pandoc's rules, bad
input refused before anything runs; and (with the [notebook] extra) two lessons executed into pages that
hold every figure they wrote and that a real browser (Debian's chromium, where installed) shows offline
with maths typeset, every image loaded and navigation that leads to pages that exist."""

import html
import json
import re
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from minidist.__main__ import main
from minidist.sim import plots
from minidist_course import book_maths
from minidist_course.book import (
    EMBEDDED_PNG,
    GENERATOR,
    LessonFailed,
    build_book,
    check_output,
    execute,
    lessons,
    navigation,
    title,
)

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
BUILT = ["02", "05"]             # two short lessons; 05 has display maths


def test_lessons_are_found_by_glob_and_titled():
    found = lessons(ROOT)
    assert found == sorted(found) and all(p.name[:2].isdigit() for p in found) and len(found) >= 15
    assert [p.name for p in lessons(ROOT, only=["2"])] == ["02_optimizers.py"]
    assert title(ROOT / "lessons" / "02_optimizers.py").startswith("02")
    with pytest.raises(ValueError, match="no lesson '99'"):
        lessons(ROOT, only=["02", "99"])


def test_a_script_writes_figures_without_trying_to_show_them(tmp_path):
    assert plots.show_inline(tmp_path / "absent.png") is False      # no kernel here: files only


def test_maths_is_found_by_pandocs_rules_and_prices_are_not_maths():
    formulas = []
    text = book_maths.extract("It cost $4.6M, or $1.50 an hour; $x^2$ and\n\n$$\\frac{a}{b}$$ and \\(y\\), "
                              "`$code$`, \\$3.", formulas)
    assert formulas == [("\\frac{a}{b}", True), ("y", False), ("x^2", False)]    # display maths first
    assert text == ("It cost &#36;4.6M, or &#36;1.50 an hour; MINIDISTMATH2X and\n\nMINIDISTMATH0X and "
                    "MINIDISTMATH1X, `$code$`, &#36;3.")
    lesson_06 = "\n".join(line[2:] for line in (ROOT / "lessons" / "06_data_parallel.py").read_text()
                          .splitlines() if line.startswith("# "))
    found = []
    book_maths.extract(lesson_06, found)
    assert found == [] and "$4.6M" in lesson_06                       # its dollars stay dollars
    pytest.importorskip("latex2mathml")                                # the [notebook] extra typesets
    page = book_maths.fill("<p>MINIDISTMATH0X</p><p>MINIDISTMATH2X</p>", formulas)
    assert '<math xmlns="http://www.w3.org/1998/Math/MathML" display="block">' in page
    assert "<mfrac>" in page and "MINIDISTMATH" not in page


def test_every_page_links_the_index_and_its_neighbours():
    pages, titles = ["a.html", "b.html", "c.html"], ["A", "B", "C"]
    assert re.findall(r'href="([^"]+)"', navigation(pages, titles, 0)) == ["index.html", "b.html"]
    assert re.findall(r'href="([^"]+)"', navigation(pages, titles, 1)) == ["index.html", "a.html", "c.html"]
    assert re.findall(r'href="([^"]+)"', navigation(pages, titles, 2)) == ["index.html", "b.html"]


def test_bad_input_is_refused_before_anything_runs(tmp_path, capsys):
    user_index = tmp_path / "site" / "index.html"
    user_index.parent.mkdir()
    user_index.write_text("the user's own page")
    assert main(["book", str(user_index.parent), "--only", "99"]) == 2      # like `run 99`
    assert main(["book", str(user_index.parent), "--only", "02"]) == 2      # would overwrite index.html
    assert user_index.read_text() == "the user's own page"
    assert main(["book", str(user_index)]) == 2                              # OUT is a file
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and "no lesson '99'" in err[0] and "index.html" in err[1] and "a folder" in err[2]
    assert all(line.startswith("python -m minidist book: error: ") for line in err)
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "index.html").write_text(GENERATOR)   # a page the book wrote may be rewritten
    check_output(tmp_path / "ours", ["index.html"])


def needs_the_notebook_extra():
    for module in ("jupytext", "nbclient", "nbconvert", "ipykernel", "latex2mathml", "tqdm"):
        pytest.importorskip(module)


@pytest.mark.slow
def test_a_page_shows_no_out_values_and_a_failing_lesson_one_line(tmp_path):
    """A lesson is a script: a cell's last expression (a path, threadpool_limits(...)) is not printed; the
    temporary folder of the figures reads as figures/."""
    needs_the_notebook_extra()
    lesson = tmp_path / "lessons" / "01_tiny.py"
    lesson.parent.mkdir()
    lesson.write_text("# %% [markdown]\n# # 01 — tiny\n\n# %%\nfrom pathlib import Path\n"
                      "print('printed in', __import__('os').environ['MINIDIST_FIGURES'])\nPath('/tmp/x')\n")
    notebook = execute(lesson, tmp_path)
    [cell] = [c for c in notebook.cells if c.cell_type == "code"]
    assert [o.output_type for o in cell.outputs] == ["stream"]
    assert cell.outputs[0].text == "printed in figures\n"
    lesson.write_text("# %%\nassert 1 + 1 == 3, 'arithmetic'\n")      # a failing lesson: one line
    with pytest.raises(LessonFailed, match=r"^01_tiny.py stopped with AssertionError: arithmetic; "):
        execute(lesson, tmp_path)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Lessons 02 and 05 built into a site: (its folder, the lines the build printed)."""
    needs_the_notebook_extra()
    out, lines = tmp_path_factory.mktemp("site"), []
    build_book(out, only=BUILT, root=ROOT, echo=lines.append)
    return out, lines


@pytest.mark.slow
def test_a_lesson_page_holds_every_figure_the_lesson_wrote(site):
    out, lines = site
    committed = {p: p.stat().st_mtime_ns for p in (ROOT / "figures").glob("0[25]_*.png")}
    text = (out / "02_optimizers.html").read_text()
    written = len(list((ROOT / "figures").glob("02_*.png")))        # what lesson 02 writes, committed
    assert text.count(EMBEDDED_PNG) == written, (written, lines)
    assert f"{written} figures written, {written} shown" in lines[0], lines
    assert "02_optimizers.html" in (out / "index.html").read_text()
    assert {p: p.stat().st_mtime_ns for p in committed} == committed     # figures/ left alone
    for page in out.glob("*.html"):
        assert "<script" not in page.read_text()                         # nothing to fetch, nothing to run


@pytest.mark.slow
def test_a_lesson_page_ends_with_its_questions_and_the_answers_page_has_their_answers(site):
    from minidist_course.questions import QUESTIONS

    out, _ = site
    page, answers = (out / "05_collectives.html").read_text(), (out / "answers.html").read_text()
    assert "Check yourself" in page and page.rindex("Check yourself") > page.rindex("Exercises")
    assert "answers.html#lesson-05" in page and 'id="lesson-05"' in answers
    for q in QUESTIONS["05"]:
        assert html.escape(q.why) not in page and html.escape(q.why) in answers
    assert "Check yourself" not in (out / "02_optimizers.html").read_text()    # lesson 02 has none
    assert 'href="answers.html"' in (out / "index.html").read_text()


# Run in the page once it has loaded: what a reader would see, as JSON in a <pre> that --dump-dom prints.
CHECK = """<script>window.addEventListener("load", () => {
  const frac = document.querySelector("mfrac"), letter = document.querySelector("math mi");
  const seen = {
    images: [...document.images].map(i => i.complete ? i.naturalWidth : 0),
    maths: document.querySelectorAll("math").length,
    fraction_height: frac ? frac.getBoundingClientRect().height : 0,
    letter_height: letter ? letter.getBoundingClientRect().height : 0,
    text: document.body.innerText,
    nav: [...document.querySelectorAll("nav.book a")].map(a => a.href),
    links: [...document.querySelectorAll("a")].map(a => a.href).filter(h => h.startsWith("file:")),
  };
  const pre = document.createElement("pre");
  pre.id = "seen"; pre.textContent = JSON.stringify(seen); document.body.appendChild(pre);
});</script>"""


def seen_in_chromium(page: Path, profile: Path) -> dict:
    """What headless chromium shows of ``page`` (a copy of it with CHECK added, beside it), offline."""
    probe = page.with_name("probe-" + page.name)
    probe.write_text(page.read_text().replace("</body>", CHECK + "</body>"))
    command = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking", "--disable-component-update",
               "--disable-sync",
               f"--user-data-dir={profile}", "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()]
    try:
        dom = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    finally:
        probe.unlink()
    found = re.search(r'<pre id="seen">(.*?)</pre>', dom, re.S)
    assert found, f"chromium showed no result for {page.name}"
    return json.loads(found.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (Debian's chromium package)")
def test_the_site_reads_offline_in_a_browser(site, tmp_path):
    out, _ = site
    pages = [out / "index.html", *(p for n in BUILT for p in out.glob(f"{n}_*.html"))]
    assert len(pages) == 3
    for page in pages:
        seen = seen_in_chromium(page, tmp_path / f"profile-{page.stem}")
        for raw in ("$$", "\\(", "\\[", "\\frac", "MINIDISTMATH"):
            assert raw not in seen["text"], (page.name, raw)
        assert "Out[" not in seen["text"] and "minidist-book-figures" not in seen["text"], page.name
        assert all(width > 0 for width in seen["images"]), (page.name, seen["images"])
        for link in seen["links"]:                 # (a heading's anchor names the probe: the page itself)
            target = Path(unquote(urlparse(link).path).replace("/probe-", "/"))
            assert target.is_file(), (page.name, link)
        if page.name == "index.html":             # each built lesson, then the questions' answers
            names = sorted(Path(unquote(urlparse(link).path)).name for link in seen["links"])
            assert names == sorted(["answers.html", *(p.name for p in pages[1:])]), names
            continue
        assert len(seen["images"]) >= 1
        nav = [Path(unquote(urlparse(link).path)).name for link in seen["nav"]]    # above and below
        assert nav[0] == "index.html" and sorted(nav) == sorted(2 * ["index.html", *(p.name for p in pages[1:]
                                                                                     if p != page)]), nav
        if page.name.startswith("05_"):           # T_ring = ... (P-1)/P ...: a fraction drawn as one
            assert seen["maths"] >= 1 and seen["fraction_height"] > 1.5 * seen["letter_height"] > 0

