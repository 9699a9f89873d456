"""Recognising an unsolved exercise in an error: the entry points stop kindly on it instead of a traceback.

A cut region raises ``NotImplementedError("exercise <id>: see <lesson>")``; inside a cluster rank the
same text reaches the parent inside ``ClusterError``'s message. The run then ends with ``stop_message``
and status 1: it did not do all it was asked. A lesson run directly (``python lessons/05_….py``) gets the
same treatment in a student copy only: ``exercises make`` appends a call of ``stop_lessons_kindly()`` to
the copy's minidist/__init__.py (the reference library installs no hook when imported).
"""

from __future__ import annotations

import os
import re
import sys

_TEXT = re.compile(r"NotImplementedError: (exercise [A-Za-z_][A-Za-z0-9_]*):")


def unsolved_exercise(error: BaseException) -> str | None:
    """'exercise <id>' if ``error`` (or an error it carries) says an exercise is not solved, else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error)
        if isinstance(error, NotImplementedError) and text.startswith("exercise "):
            return text.split(":", 1)[0]
        if match := _TEXT.search(text):
            return match[1]
        error = error.__cause__ or error.__context__
    return None


def stop_message(subject: str, rerun: str, exercise: str) -> str:
    """What a lesson or the demo prints when it reaches ``exercise`` ("exercise <id>") unsolved."""
    name = exercise.split(" ", 1)[-1]
    return (f"\n{subject} stops here: it needs {exercise}, which is not solved yet in this copy.\n"
            f"Solve it (lessons/EXERCISES.md says where), check it with\n\n"
            f"    python -m pytest --exercise {name}\n\nthen run {rerun} again.")


def stop_lessons_kindly() -> None:
    """When the running script is a lesson (lessons/NN_….py): an uncaught error that says an exercise is
    unsolved prints ``stop_message`` and exits with status 1; any other error goes to the previous hook."""
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.basename(os.path.dirname(script)) != "lessons":
        return
    previous = sys.excepthook

    def hook(kind, error, tb):
        exercise = unsolved_exercise(error)   # raised here, or inside a cluster rank (in ClusterError)
        if exercise is None:
            previous(kind, error, tb)
            return
        print(stop_message("This lesson", "the lesson", exercise), flush=True)
        os._exit(1)

    sys.excepthook = hook
