"""A pytest plugin the grader loads (``-p``): it writes what happens, as it happens, to a report file.

The grader copies this file to the root of its grading tree and points MINIDIST_GRADE_REPORT at a file.
Lines are JSON, appended with one write each (so lines never interleave):
    {"collected": {test id: [exercise ids]}, "promises": {test id: promise}}   once per collecting process
    {"start": test id}                          when a test starts
    {"finish": test id}                         when it is over (setup, call and teardown)
    {"id": ..., "when": "setup" | "call" | "teardown", "outcome": ..., "message": ..., "seconds": ...}
Reading it while pytest runs gives progress; after a kill it still says which test was running.
With pytest-xdist, start and result lines come from the controller, which sees every worker's tests.
"""

from __future__ import annotations

import json
import os
import re

import pytest

MESSAGE_CHARS = 300
RAW_BYTES = re.compile(r"""(?<![\w'"])b(['"]).*?(?<!\\)\1""")    # b'...' / b"...": not for a student


def _write(entry: dict) -> None:
    path = os.environ.get("MINIDIST_GRADE_REPORT")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)


_worker = False


def _exercises(item) -> list[str]:
    return sorted({m.args[0] for m in item.iter_markers("exercise") if m.args})


def _promise(item) -> str:
    """The promise of its exercise that the test checks (``@pytest.mark.promise(name)``; else "values")."""
    mark = item.get_closest_marker("promise")
    return mark.args[0] if mark is not None and mark.args else "values"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if os.environ.get("MINIDIST_GRADE_ONLY_INTEGRATION"):     # the integration session: several exercises
        config.hook.pytest_deselected(items=[item for item in items if len(_exercises(item)) < 2])
        items[:] = [item for item in items if len(_exercises(item)) >= 2]
    _write({"collected": {item.nodeid: _exercises(item) for item in items},
            "promises": {item.nodeid: _promise(item) for item in items}})


def pytest_runtest_logstart(nodeid, location):
    if not _worker:
        _write({"start": nodeid})


def pytest_runtest_logfinish(nodeid, location):
    if not _worker:
        _write({"finish": nodeid})


def short_message(report) -> str:
    """The exception's first line (e.g. "AssertionError: assert 3 == 5"), hypothesis's failing example if
    any, or a skip's reason; at most MESSAGE_CHARS characters (a rank's traceback is left out)."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:       # a skip: (file, line, reason)
        text = str(longrepr[2])
    elif getattr(longrepr, "reprcrash", None) is not None:
        lines = [line.strip() for line in longrepr.reprcrash.message.splitlines() if line.strip()]
        example = [i for i, line in enumerate(lines)
                   if line.startswith(("Falsifying example", "Failing test case"))]
        first = lines[:2] if len(lines) > 1 and lines[1].startswith("+") else lines[:1]   # "+ where ..."
        text = " ".join(first + (lines[example[0]:example[0] + 6] if example else []))
    else:
        lines = [line for line in str(longrepr or "").splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("E ")]
        text = (errors or lines or [""])[-1]
    text = RAW_BYTES.sub("<raw bytes>", " ".join(text.split()))
    if text.rstrip(":") in ("AssertionError", "assert"):       # `raise AssertionError()`, `assert x` bare
        text = "AssertionError with no message (see the test's source for what it checks)"
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 3] + "..."


def pytest_runtest_logreport(report):
    if not _worker and (report.when == "call" or report.outcome != "passed"):
        _write({"id": report.nodeid, "when": report.when, "outcome": report.outcome,
                "message": short_message(report) if report.outcome != "passed" else "",
                "seconds": round(report.duration, 3)})


def pytest_configure(config):
    # Under xdist the controller reports every test; a worker only says what it collected.
    global _worker
    _worker = hasattr(config, "workerinput")
