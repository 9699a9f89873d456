"""Time the grader: one full grade of a student copy, and a class of 5 copies (some solved, some not).

Target (issue "Running a course"): a full grade of one submission in <= 2 minutes on an idle 2-core
machine. For comparison the script also times the tests alone: the same pytest session on the reference
tree (every test that reaches an exercise, the same workers and hypothesis profile), no tree building.

    python benchmarks/grade.py              # from the repository root; results go to benchmarks/grade.md
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minidist.exercises import all_regions, grade_submission, load_map, make_student_copy  # noqa: E402
from minidist.exercises.grade import default_workers  # noqa: E402

TARGET_SECONDS = 120.0


def tests_only(ids: list[str], workers: int) -> float:
    files = sorted({t.split("::")[0] for t in load_map(ROOT)})
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=60",
           *(["-n", str(workers)] if workers > 1 else []),
           *[a for ex in ids for a in ("--exercise", ex)], *files]
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg", HYPOTHESIS_PROFILE="grading")
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def timed_grade(copy: Path) -> tuple[float, object]:
    start = time.perf_counter()
    report = grade_submission(copy, ROOT)
    return time.perf_counter() - start, report


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    ids = sorted({r.exercise for r in all_regions(ROOT)})
    workers = default_workers()
    print(f"grader benchmark: {len(ids)} exercises, {len(load_map(ROOT))} mapped tests, {workers} worker(s), "
          f"{os.cpu_count()} cpu(s), load average {os.getloadavg()[0]:.1f} at the start")
    suite = tests_only(ids, workers)
    print(f"tests only (reference tree, all passing):     {suite:6.1f} s")
    half = ids[::2]
    plans = {"all-cut": dict(), "all-solved": dict(only=[]), "half-solved": dict(keep=half),
             "other-half": dict(only=half), "one-solved": dict(keep=["ring_allreduce"])}
    with tempfile.TemporaryDirectory(prefix="minidist-bench-grade-") as tmp:
        copies = {}
        for name, plan in plans.items():
            copies[name] = Path(tmp) / name
            make_student_copy(ROOT, copies[name], **plan)
        one, report = timed_grade(copies["all-cut"])
        print(f"full grade of one student copy (all cut):      {one:6.1f} s   "
              f"score {report.total_score:.2f}  "
              f"(target <= {TARGET_SECONDS:.0f} s on an idle machine)")
        start = time.perf_counter()
        for name, copy in copies.items():
            seconds, report = timed_grade(copy)
            print(f"  class member {name:12s} {seconds:6.1f} s   score {report.total_score:.2f}  "
                  f"{report.status}")
        total = time.perf_counter() - start
        print(f"class of {len(copies)} copies, graded one after another: {total:6.1f} s "
              f"({total / len(copies):.1f} s per copy)")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
