"""Recognising an unsolved exercise in an error: the entry points stop kindly on it instead of a traceback.

A cut region raises ``NotImplementedError("exercise <id>: see <lesson>")``; inside a cluster rank the
same text reaches the parent inside ``ClusterError``'s message. (A lesson run directly gets the same
treatment from the hook in minidist/__init__.py.)
"""

from __future__ import annotations

import re

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
