"""`pytest --exercise ID` for a student: quick to fail, one live line per test group.

A student's run (``--exercise`` given, outside the grader, without MINIDIST_ALL_TESTS=1) uses the
"student" hypothesis profile (few examples, no shrinking), runs the diagnosing checks
(``@pytest.mark.diagnose``) first, and, once a test of a group (a test file) fails, skips the rest of that
group: its first failure is the one to read. pytest's line per group shows its progress; a group's first
failure gets a line of its own the moment it happens. The grader and
CI (the thorough and default profiles) run every test.
"""

import os

import pytest

STOP_REASON = "an earlier test of this group failed: fix that one first (MINIDIST_ALL_TESTS=1 runs all)"


def student_run(config) -> bool:
    return bool(config.getoption("--exercise")) and not os.environ.get("MINIDIST_GRADE_REPORT") \
        and not os.environ.get("MINIDIST_ALL_TESTS")


def group_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


class StudentRun:
    """The groups that failed; a group's first failure is written the moment it happens."""

    def __init__(self, config):
        self.config, self.failed = config, set()

    def record(self, report):
        group = group_of(report.nodeid)
        if not report.failed or group in self.failed:
            return
        self.failed.add(group)
        crash = getattr(report.longrepr, "reprcrash", None)
        message = " ".join(str(crash.message if crash else report.longrepr).split())
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.write_line(f"\n  -> {group}: first failure: {message[:240]}; the rest of this group "
                                f"is skipped")


_RUN: StudentRun | None = None


def configure(config):
    global _RUN
    if student_run(config) and "HYPOTHESIS_PROFILE" not in os.environ:
        from hypothesis import settings

        settings.load_profile("student")
        _RUN = StudentRun(config)


def setup(item):
    if _RUN is not None and group_of(item.nodeid) in _RUN.failed:
        pytest.skip(STOP_REASON)


def logreport(report):
    if _RUN is not None:
        _RUN.record(report)
