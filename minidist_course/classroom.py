"""Grade a class: every (student, exercise) session in one queue, ``jobs`` at a time, a line per student.

The queue holds each submission's exercise sessions (and its integration session, if asked), student
after student, so the machine's cores stay busy across students and the grades arrive in order. Code
that two submissions share for an exercise (an exercise left as published, a solution handed out) is
graded once: same code, same tests, same derandomized examples give the same result. When a student's
last session ends, a line says their score, what hung or crashed, and how long the class has left (the
time so far per finished session times the sessions left). The reference is read once (Reference) and
each submission's files once (the keys that let students share a session). A report's seconds are the
sum of its exercises' sessions (shared ones included).
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from pathlib import Path

from minidist.nn.checks import check_count, check_real

from .exercise_map import own_exercise
from .grade import (
    Job,
    Reference,
    SubmissionReport,
    assemble,
    check_submission,
    graded_ids,
    run_job,
    student_keys,
)
from .report import student_names
from .results import ExerciseResult


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}:{secs:02d}"


def grade_class(submissions: list[Path], root: Path, exercises: list[str] | None = None,
                hidden: Path | None = None, timeout: float = 30.0, limit: float = 300.0, jobs: int = 2,
                integration: bool = False, echo=None, progress=None) -> list[SubmissionReport]:
    """Grade every submission against the reference at ``root``; reports in the submissions' order.

    exercises: the ids to grade (default: all); hidden: a directory of extra test files; timeout: seconds
    one test may run before it is killed (hung); limit: seconds for one exercise's session in all;
    jobs: sessions at a time; integration: also run the tests that reach several exercises;
    echo(line): a line per student as soon as they are graded (per exercise too for one student);
    progress(done, total): after each session (sessions shared by several students count once).
    """
    jobs = check_count(jobs, "jobs")
    timeout = check_real(timeout, "timeout", 0, strict=True)
    limit = check_real(limit, "limit", 0, strict=True)
    ref = Reference.read(root)
    submissions = [Path(s).resolve() for s in submissions]
    for submission in submissions:
        check_submission(submission, ref.regions)          # all refused at once, before any grading
    ids = graded_ids(ref.regions, exercises)
    # A student's longest sessions first (most own tests), so the two workers finish them together.
    size = {ex: sum(own_exercise(found) == ex for found in ref.test_map.values()) for ex in ids}
    keys: list[str | None] = sorted(ids, key=lambda ex: -size[ex]) + ([None] if integration else [])
    names = dict(zip(submissions, student_names(submissions), strict=True))
    results: dict[Path, dict] = {s: {} for s in submissions}
    reports: dict[Path, SubmissionReport] = {}
    start = time.monotonic()

    def one(job: Job, work: Path):
        with tempfile.TemporaryDirectory(prefix="minidist-grade-", dir=work) as tmp:
            return run_job(job, ref, Path(tmp), Path(hidden) if hidden else None, timeout, limit)

    with tempfile.TemporaryDirectory(prefix="minidist-class-") as work, \
            ThreadPoolExecutor(max_workers=jobs) as pool:
        shared: dict[tuple, Future] = {}
        waiting: dict[Future, list[Job]] = {}
        for submission in submissions:              # student after student: the first finishes first
            code = student_keys(submission, ref.regions, ids)
            for exercise in keys:
                key = (exercise, code[exercise]) if exercise else (None, str(submission))
                if key not in shared:
                    shared[key] = pool.submit(one, Job(submission, exercise, ids), Path(work))
                waiting.setdefault(shared[key], []).append(Job(submission, exercise, ids))
        if progress:
            progress(0, len(waiting))
        for done, future in enumerate(as_completed(waiting), 1):
            out = future.result()
            if progress:
                progress(done, len(waiting))
            for job in waiting[future]:
                results[job.submission][job.exercise] = out
                if echo and len(submissions) == 1 and job.exercise:
                    echo(_exercise_line(job.exercise, out))
                if len(results[job.submission]) == len(keys):
                    done_jobs = results[job.submission]
                    seconds = sum(r[3] for r in done_jobs.values())
                    report = assemble(job.submission, ids, done_jobs, seconds, jobs, ref.promises)
                    reports[job.submission] = report
                    if echo:
                        left = (time.monotonic() - start) * (len(waiting) - done) / done
                        echo(_line(report, names[job.submission], len(reports), len(submissions),
                                   time.monotonic() - start, left))
    return [reports[s] for s in submissions]


def _exercise_line(exercise: str, out) -> str:
    tests = out[0]
    passed = sum(t.outcome == "passed" for t in tests)
    worst = [t.outcome for t in tests if t.outcome in ("hung", "crashed")]
    return (f"  {exercise:28s} {passed}/{len(tests)} passed  {out[3]:5.1f} s"
            + (f"  ({', '.join(worst)})" if worst else ""))


def _line(report: SubmissionReport, name: str, done: int, total: int, elapsed: float, left: float) -> str:
    trouble = sorted({f"{i['exercise']} {i['outcome']}" for i in report.incidents})
    return (f"[{done}/{total}] {name}: {report.status}, score "
            f"{report.total_score:.2f}" + (f" ({'; '.join(trouble)})" if trouble else "")
            + f"; {_clock(elapsed)} elapsed" + (f", about {_clock(left)} left" if done < total else ""))


def grade_submission(submission: Path, root: Path, exercises: list[str] | None = None,
                     hidden: Path | None = None, timeout: float = 30.0, limit: float = 300.0,
                     jobs: int = 2, integration: bool = False, echo=None) -> SubmissionReport:
    """Grade ``submission`` against the reference at ``root`` (see grade_class for the arguments)."""
    return grade_class([submission], root, exercises, hidden, timeout, limit, jobs, integration, echo)[0]


def grade(submission: Path, root: Path, exercises: list[str] | None = None, hidden: Path | None = None,
          timeout: float = 30.0) -> list[ExerciseResult]:
    """The per-exercise results of ``grade_submission`` (scores from each exercise's own tests)."""
    return grade_submission(submission, root, exercises, hidden, timeout).exercises


def grade_exercise(submission: Path, root: Path, exercise: str, hidden: Path | None = None,
                   timeout: float = 30.0) -> ExerciseResult:
    return grade(submission, root, [exercise], hidden, timeout)[0]
