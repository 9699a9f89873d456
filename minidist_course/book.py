"""``python -m minidist book OUT``: every lesson executed as a notebook and published as a static site.

Each ``lessons/NN_topic.py`` (found by glob, so new lessons join by themselves) is read as a notebook
(jupytext, percent format), executed in a fresh Python kernel (nbclient) from the repository root, and
converted to one self-contained HTML page (nbconvert: text, code, printed output, figures embedded) with a
link to the index and to the previous and next lesson; a lesson with check-yourself questions
(``minidist_course.questions``) ends with them, their answers on ``answers.html``. ``index.html`` lists the
lessons with their titles and exercises. The site needs no network: maths is typeset into MathML when the book
is built (``minidist_course.book_maths``), and the pages load no script. A lesson is a script, so its page
shows what running it prints: the value of a cell's last expression (``Out[]``) is not shown, and the
temporary folder the figures went to is printed as ``figures``, where a reader's own run puts them. Figures
reach the page because ``sim.plots`` shows every figure it writes inline when it runs in a kernel; each lesson
writes its PNGs to a folder of its own (MINIDIST_FIGURES), never to the committed figures/, and the book
checks that its page holds at least as many images as the lesson wrote. Needs the ``[notebook]`` extra.
"""

from __future__ import annotations

import glob
import html
import os
import sys
import tempfile
from pathlib import Path

from . import book_maths, questions

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_PNG = 'src="data:image/png;base64,'
GENERATOR = '<meta name="generator" content="minidist book">'   # marks the files the book may rewrite

# The page: JupyterLab's look without its scripts (MathJax, require.js, mermaid all come from a CDN),
# and the navigation above and below the lesson.
TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}""" + GENERATOR + """{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}<style>nav.book{margin:1em 2em;font-family:sans-serif}
nav.book a{margin-right:2em}math{font-size:1.2em}</style>{%- endblock extra_css -%}
{%- block body_header -%}{{ super() }}{{ resources.book_nav }}{%- endblock body_header -%}
{%- block body_footer -%}{{ resources.book_nav }}{{ super() }}{%- endblock body_footer -%}
"""


class LessonFailed(RuntimeError):
    """A lesson raised when executed (one of its own asserts, most often): the book stops there."""


def lessons(root: Path = ROOT, only: list[str] | None = None) -> list[Path]:
    """lessons/NN_*.py in order; ``only``: lesson numbers ("02", "5") to keep.

    Raises ValueError naming a number in ``only`` that no lesson has."""
    paths = [Path(p) for p in sorted(glob.glob(str(Path(root) / "lessons" / "[0-9][0-9]_*.py")))]
    if only:
        wanted = {str(n).zfill(2): n for n in only}
        unknown = [n for key, n in wanted.items() if key not in {p.name[:2] for p in paths}]
        if unknown:
            raise ValueError(f"--only: no lesson {unknown[0]!r}; `python -m minidist lessons` lists them")
        paths = [p for p in paths if p.name[:2] in wanted]
    return paths


def title(path: Path) -> str:
    """The lesson's heading: its first line "# # ..." (jupytext's first Markdown title)."""
    for line in path.read_text().splitlines():
        if line.startswith("# # "):
            return line[4:].strip()
    return path.stem


def check_output(out: Path, names: list[str]) -> None:
    """Refuse (ValueError) an ``out`` that is not a folder, or that holds one of ``names`` not written by
    the book: the book never overwrites a user's file."""
    out = Path(out)
    if out.is_symlink() and not out.exists():
        raise ValueError(f"OUT: {str(out)!r} is a link to {os.readlink(out)!r}, which does not exist; "
                         "give a folder (new or the book's)")
    if out.exists() and not out.is_dir():
        raise ValueError(f"OUT: expected a folder for the site, got the file {str(out)!r}")
    blocking = [p for p in out.parents if p.exists() and not p.is_dir()]
    if blocking:
        raise ValueError(f"OUT: {str(out)!r} lies under the file {str(blocking[-1])!r}; a folder cannot be "
                         "made there")
    for name in names:
        target = out / name
        ours = target.is_file() and not target.is_symlink() \
            and GENERATOR in target.read_text(errors="replace")
        if (target.exists() or target.is_symlink()) and not ours:
            raise ValueError(f"OUT: {str(target)!r} exists and was not written by the book; "
                             "choose an empty or new folder")


def navigation(pages: list[str], titles: list[str], i: int) -> str:
    """The links of page ``i``: the index, the previous and the next lesson (where there is one)."""
    links = ['<a href="index.html" rel="index">index</a>']
    if i > 0:
        links.append(f'<a href="{pages[i - 1]}" rel="prev">← {html.escape(titles[i - 1])}</a>')
    if i + 1 < len(pages):
        links.append(f'<a href="{pages[i + 1]}" rel="next">{html.escape(titles[i + 1])} →</a>')
    return '<nav class="book">' + "".join(links) + "</nav>"


def execute(path: Path, figures: Path, timeout: float = 600.0):
    """The lesson as a notebook, executed in a kernel from the repository root (figures to ``figures``);
    LessonFailed, in one line, when a cell raises."""
    import jupytext
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from traitlets.config import Config

    notebook = jupytext.read(path)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    old = os.environ.get("MINIDIST_FIGURES")
    os.environ["MINIDIST_FIGURES"] = str(figures)          # the kernel inherits this environment
    # Talk to the kernel over local sockets in the figures' folder (IPC) where there are such sockets:
    # over TCP the kernel warns, once per lesson, that its traffic is not encrypted.
    local = {"transport": "ipc", "ip": str(Path(figures) / "kernel")} if os.name == "posix" else {}
    try:                                                   # (the client starts and shuts down the kernel)
        NotebookClient(notebook, timeout=timeout, kernel_name="python3", config=Config(KernelManager=local),
                       resources={"metadata": {"path": str(path.parent.parent)}}).execute()
    except CellExecutionError as error:                    # its cell's whole source is no message
        raise LessonFailed(f"{path.name} stopped with {error.ename}: {error.evalue or '(no message)'}; "
                           f"`python -m minidist run {path.name[:2]}` shows where") from None
    finally:
        if old is None:
            del os.environ["MINIDIST_FIGURES"]
        else:
            os.environ["MINIDIST_FIGURES"] = old
    for cell in notebook.cells:
        if cell.cell_type == "code":                       # a script shows no Out[] values
            cell.outputs = [o for o in cell.outputs if o.output_type != "execute_result"]
            for output in cell.outputs:                    # "figures in /tmp/...": where a reader's go
                if output.output_type == "stream":
                    output.text = output.text.replace(str(figures), "figures")
    return notebook


def end_with_questions(notebook, lesson: str):
    """The notebook with the lesson's check-yourself questions appended as a Markdown cell (if it has any;
    their answers are on answers.html)."""
    check = questions.questions_markdown(lesson)
    if check:
        from nbformat.v4 import new_markdown_cell

        notebook.cells.append(new_markdown_cell(check))
    return notebook


def render_lesson(path: Path, figures: Path, nav: str = "", timeout: float = 600.0) -> tuple[str, int]:
    """(the HTML page, how many figures the lesson wrote) after executing the lesson in a kernel."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    notebook = end_with_questions(execute(path, figures, timeout), path.name[:2])
    formulas: list[tuple[str, bool]] = []
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell.source = book_maths.extract(cell.source, formulas)
    exporter = HTMLExporter(extra_loaders=[DictLoader({"book.html.j2": TEMPLATE})],
                            template_file="book.html.j2")
    page, _ = exporter.from_notebook_node(
        notebook, resources={"book_nav": nav, "metadata": {"name": title(path)}})
    return book_maths.fill(page, formulas), len(list(figures.glob("*.png")))


def index_page(rows: list[tuple[Path, str, list[str]]]) -> str:
    """The site's front page: a table of the lessons (number, title linked to its page, exercises)."""
    lines = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', GENERATOR,
             "<title>minidist: the lessons</title>",
             ("<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:.3em .8em;"
              "text-align:left;vertical-align:top}</style></head><body>"),
             "<h1>minidist: distributed deep-learning training, in NumPy</h1>",
             ("<p>Each lesson was executed as it stands; its page shows its text, code, output and figures."
              "</p>"), "<table><tr><th>lesson</th><th>title</th><th>exercises</th></tr>"]
    for path, name, exercises in rows:
        lines.append(f'<tr><td>{path.name[:2]}</td><td><a href="{path.stem}.html">{html.escape(name)}</a>'
                     f'</td><td>{html.escape(", ".join(exercises))}</td></tr>')
    answers = '<p><a href="answers.html">Check yourself: the answers</a></p>'
    return "\n".join(lines + ["</table>", answers, "</body></html>", ""])


def build_book(out: Path, only: list[str] | None = None, root: Path = ROOT, echo=print) -> list[Path]:
    """Write OUT/index.html and OUT/NN_topic.html for every lesson (or the ``only`` ones); return the pages.

    Raises ValueError (before running anything) for an unknown lesson in ``only``, an OUT that is a file,
    or a file in OUT that the book would overwrite but did not write; RuntimeError when a lesson's page
    holds fewer images than the lesson wrote figures. Shows a progress bar when stdout is a terminal."""
    from tqdm import tqdm

    from minidist_course.registry import load_registry

    out = Path(out)
    paths = lessons(root, only)
    names = [f"{p.stem}.html" for p in paths]
    check_output(out, ["index.html", "answers.html", *names])
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:                  # e.g. no permission: one line, as for the checks above
        raise ValueError(f"OUT: cannot make the folder {str(out)!r}: {err.strerror}") from err
    by_lesson: dict[str, list[str]] = {}
    for ex in load_registry(root).values():
        by_lesson.setdefault(Path(ex.lesson).name, []).append(ex.id)
    titles = [title(p) for p in paths]
    rows, pages = [], []
    bar = tqdm(paths, unit="lesson", disable=not sys.stdout.isatty(), leave=False)
    for i, path in enumerate(bar):
        bar.set_description(path.stem)
        with tempfile.TemporaryDirectory(prefix="minidist-book-figures-") as figures:
            page, written = render_lesson(path, Path(figures), navigation(names, titles, i))
        shown = page.count(EMBEDDED_PNG)
        if shown < written:
            raise RuntimeError(f"{path.name}: wrote {written} figures but its page shows {shown}")
        target = out / names[i]
        target.write_text(page)
        pages.append(target)
        rows.append((path, titles[i], by_lesson.get(path.name, [])))
        (bar.write if echo is print else echo)(f"{target}: {written} figures written, {shown} shown")
    (out / "index.html").write_text(index_page(rows))
    (out / "answers.html").write_text(questions.answers_page([p.name[:2] for p in paths], GENERATOR))
    return pages
