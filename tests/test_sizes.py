"""Readable first: no file under minidist/ or minidist_course/ passes 300 lines, no lesson passes 400
(DESIGN.md's layout).

The test lists every offender with its size, and the five largest files of each kind, so the message
says where to split next.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY_LIMIT, LESSON_LIMIT = 300, 400


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def sizes(files) -> list[tuple[int, str]]:
    """(lines, path relative to the repository) for each file, largest first."""
    return sorted(((line_count(f), f.relative_to(ROOT).as_posix()) for f in files), reverse=True)


def over(limit: int, counted: list[tuple[int, str]], what: str) -> str:
    """'' if every file is within ``limit`` lines, else a message naming every offender and the largest
    five."""
    offenders = [(n, path) for n, path in counted if n > limit]
    if not offenders:
        return ""
    listing = "\n".join(f"  {path}: {n} lines" for n, path in offenders)
    largest = "\n".join(f"  {path}: {n}" for n, path in counted[:5])
    return (f"{len(offenders)} {what} over {limit} lines (split them):\n{listing}\n"
            f"the five largest {what}:\n{largest}")


def test_sizes_message_names_every_offender_and_the_largest_five():
    counted = [(420, "b.py"), (310, "a.py"), (300, "c.py"), (12, "d.py"), (11, "e.py"), (10, "f.py")]
    message = over(300, counted, "files")
    assert "b.py: 420 lines" in message and "a.py: 310 lines" in message and "c.py: 300 lines" not in message
    assert message.startswith("2 files over 300 lines")
    assert message.splitlines()[-5:] == [
        "  b.py: 420",
        "  a.py: 310",
        "  c.py: 300",
        "  d.py: 12",
        "  e.py: 11",
    ]
    assert over(420, counted, "files") == ""


def test_sizes_library_files_stay_under_300_lines():
    counted = sizes([*(ROOT / "minidist").rglob("*.py"), *(ROOT / "minidist_course").rglob("*.py")])
    assert counted, "found no library files: is the repository layout different?"
    message = over(LIBRARY_LIMIT, counted, "library files")
    assert not message, message


def test_sizes_lessons_stay_under_400_lines():
    counted = sizes((ROOT / "lessons").glob("*.py"))
    assert counted, "found no lessons: is the repository layout different?"
    message = over(LESSON_LIMIT, counted, "lessons")
    assert not message, message
