"""Smoke test: every lesson script runs headless to the end (its own asserts included) and exits 0."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_runs(lesson, tmp_path):
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(lesson)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240, check=False)
    assert done.returncode == 0, f"{lesson.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
