"""Recording which test reaches which exercise region (used only in the instrumented copy).

The instrumented copy holds this file as _minidist_exercise_hits.py at its root; its regions call
``record(exercise_id)``. When MINIDIST_EXERCISE_HITS names a file, the pair (current pytest test id,
exercise id) is appended to it once per process. pytest puts the current
test's id in the PYTEST_CURRENT_TEST environment variable, and worker processes inherit the environment,
so a region reached inside a cluster rank is credited to the test that started the run.
"""

from __future__ import annotations

import json
import os

_seen: set[tuple[str, str]] = set()


def record(exercise: str) -> None:
    path = os.environ.get("MINIDIST_EXERCISE_HITS")
    current = os.environ.get("PYTEST_CURRENT_TEST")
    if not path or not current:
        return
    test = current.rsplit(" (", 1)[0]   # "tests/x.py::test_y (call)" -> "tests/x.py::test_y"
    if (test, exercise) in _seen:
        return
    _seen.add((test, exercise))
    line = json.dumps([test, exercise]) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())   # one short O_APPEND write: lines from many processes never interleave
    finally:
        os.close(fd)
