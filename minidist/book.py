"""``python -m minidist book OUT``: every lesson executed as a notebook and published as a static site.

Each ``lessons/NN_topic.py`` (found by glob, so new lessons join by themselves) is read as a notebook
(jupytext, percent format), executed in a fresh Python kernel (nbclient) from the repository root, and
converted to one self-contained HTML page (nbconvert: text, code, printed output, figures embedded).
``index.html`` lists the lessons with their titles and exercises. Figures reach the page because
``minidist.plots`` shows every figure it writes inline when it runs in a kernel; each lesson writes its
PNGs to a folder of its own (MINIDIST_FIGURES), never to the committed figures/, and the book checks
that its page holds at least as many images as the lesson wrote. Needs the ``[notebook]`` extra.
"""

from __future__ import annotations

import glob
import html
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_PNG = 'src="data:image/png;base64,'


def lessons(root: Path = ROOT, only: list[str] | None = None) -> list[Path]:
    """lessons/NN_*.py in order; ``only``: lesson numbers ("02", "5") to keep."""
    paths = [Path(p) for p in sorted(glob.glob(str(Path(root) / "lessons" / "[0-9][0-9]_*.py")))]
    if only:
        wanted = {n.zfill(2) for n in only}
        paths = [p for p in paths if p.name[:2] in wanted]
    return paths


def title(path: Path) -> str:
    """The lesson's heading: its first line "# # ..." (jupytext's first Markdown title)."""
    for line in path.read_text().splitlines():
        if line.startswith("# # "):
            return line[4:].strip()
    return path.stem


def render_lesson(path: Path, figures: Path, timeout: float = 600.0) -> tuple[str, int]:
    """(the HTML page, how many figures the lesson wrote) after executing the lesson in a kernel."""
    import jupytext
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    notebook = jupytext.read(path)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    old = os.environ.get("MINIDIST_FIGURES")
    os.environ["MINIDIST_FIGURES"] = str(figures)          # the kernel inherits this environment
    try:
        NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent.parent)}}).execute()
    finally:
        if old is None:
            del os.environ["MINIDIST_FIGURES"]
        else:
            os.environ["MINIDIST_FIGURES"] = old
    page, _ = HTMLExporter().from_notebook_node(notebook)
    return page, len(list(figures.glob("*.png")))


def index_page(rows: list[tuple[Path, str, list[str]]]) -> str:
    """The site's front page: a table of the lessons (number, title linked to its page, exercises)."""
    lines = ["<!DOCTYPE html>", '<html><head><meta charset="utf-8"><title>minidist: the lessons</title>',
             ("<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:.3em .8em;"
              "text-align:left;vertical-align:top}</style></head><body>"),
             "<h1>minidist: distributed deep-learning training, in NumPy</h1>",
             ("<p>Each lesson was executed as it stands; its page shows its text, code, output and figures."
              "</p>"), "<table><tr><th>lesson</th><th>title</th><th>exercises</th></tr>"]
    for path, name, exercises in rows:
        lines.append(f'<tr><td>{path.name[:2]}</td><td><a href="{path.stem}.html">{html.escape(name)}</a>'
                     f'</td><td>{html.escape(", ".join(exercises))}</td></tr>')
    return "\n".join(lines + ["</table>", "</body></html>", ""])


def build_book(out: Path, only: list[str] | None = None, root: Path = ROOT, echo=print) -> list[Path]:
    """Write OUT/index.html and OUT/NN_topic.html for every lesson (or the ``only`` ones); return the pages.

    Raises RuntimeError when a lesson's page holds fewer images than the lesson wrote figures."""
    from minidist.exercises.registry import load_registry

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    by_lesson: dict[str, list[str]] = {}
    for ex in load_registry(root).values():
        by_lesson.setdefault(Path(ex.lesson).name, []).append(ex.id)
    rows, pages = [], []
    for path in lessons(root, only):
        with tempfile.TemporaryDirectory(prefix="minidist-book-figures-") as figures:
            page, written = render_lesson(path, Path(figures))
        shown = page.count(EMBEDDED_PNG)
        if shown < written:
            raise RuntimeError(f"{path.name}: wrote {written} figures but its page shows {shown}")
        target = out / f"{path.stem}.html"
        target.write_text(page)
        pages.append(target)
        rows.append((path, title(path), by_lesson.get(path.name, [])))
        echo(f"{target}: {written} figures written, {shown} shown")
    (out / "index.html").write_text(index_page(rows))
    return pages
