"""Run one pytest session for the grader: in its own process group, watched, killed whole when done.

pytest starts in a new session (``start_new_session=True``): it, its xdist workers, the cluster ranks
its tests start and anything those start share one process group. Results come from the report file
that the grader's plugin writes (pytest_report.py), never from pipes: a stray grandchild that holds an
output pipe cannot stall the grade. When pytest ends, or when the submission's time limit passes, the
whole group is killed, so nothing a student's code started outlives its grade.

``run_in_group`` is that loop, with the decision to stop left to a ``check()`` the caller passes:
``run_watched`` (the isolation check) stops at a time limit; sessions.py (the grader) also stops a
test that runs too long, reading the report file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

POLL_SECONDS = 1.0


@dataclass
class RunOutcome:
    returncode: int | None   # None when the time limit killed it
    timed_out: bool
    seconds: float
    log_tail: str            # the end of pytest's own output, for errors that happen before any test


def kill_group(pgid: int) -> None:
    """SIGKILL every process of the group (pytest, its workers, ranks, strays); quiet if none is left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_in_group(cmd: list[str], cwd: Path, env: dict[str, str], log: Path, poll: float,
                 check: Callable[[], str]) -> tuple[subprocess.Popen, str]:
    """Run cmd in a new session with its output in ``log``; every ``poll`` seconds while it runs call
    ``check()``: a non-empty answer (why it must stop) kills the whole group at once. The group is killed
    at the end in any case (strays left by a finished pytest, or everything on an interrupt). Returns the
    ended process and why it was killed ("" if it ended by itself)."""
    why = ""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while not why:
                try:
                    proc.wait(timeout=poll)
                    break
                except subprocess.TimeoutExpired:
                    why = check()
        finally:
            kill_group(proc.pid)
            if proc.poll() is None:
                proc.wait()
    return proc, why


def run_watched(cmd: list[str], cwd: Path, env: dict[str, str], log: Path, limit: float,
                progress=None) -> RunOutcome:
    """Run cmd in a new session with its output in ``log``; ``progress(elapsed)`` is called about once a
    second while it runs. After ``limit`` seconds the whole group is killed."""
    start = time.monotonic()

    def check() -> str:
        elapsed = time.monotonic() - start
        if progress is not None:
            progress(elapsed)
        return "timed out" if elapsed > limit else ""

    proc, why = run_in_group(cmd, cwd, env, log, POLL_SECONDS, check)
    text = log.read_text(errors="replace") if log.exists() else ""
    return RunOutcome(None if why else proc.returncode, bool(why), time.monotonic() - start, text[-3000:])
