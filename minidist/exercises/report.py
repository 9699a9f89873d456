"""Grades written out: a table for the terminal, Markdown feedback for a student, CSV for a class."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

from .grade import SubmissionReport


def environment_line(env: dict) -> str:
    return (f"python {env['python']}, numpy {env['numpy']}, torch {env['torch']}, "
            f"ml_dtypes {env['ml_dtypes']}, "
            f"hypothesis {env['hypothesis']}; {env['workers']} session(s) at a time on {env['cpus']} cpu(s)")


def format_text(report: SubmissionReport) -> str:
    out = [f"{report.submission}: {report.status} in {report.seconds:.0f} s",
           f"environment: {environment_line(report.environment)}",
           f"{'exercise':28s} {'own tests':>9s} {'skipped':>8s}  score"]
    for r in report.exercises:
        note = f"  ({r.error})" if r.error else ""
        out.append(f"{r.exercise:28s} {r.passed:4d}/{r.total:<4d} {r.skipped:8d}  {r.score:.2f}{note}")
    if report.integration:
        out.append("integration tests (reach several exercises; not in the scores):")
        for g in report.integration:
            skipped = f", {g.skipped} skipped" if g.skipped else ""
            out.append(f"  {g.name}: {g.passed}/{g.total}{skipped}")
    for i in report.incidents:
        out.append(f"{i['outcome']} in {i['exercise']}: {i['test']} — {i['message']}")
    out.append(f"{'overall':28s} {'':18s}  {report.total_score:.2f}")
    if report.log_tail:
        out.append("pytest said:\n" + report.log_tail)
    return "\n".join(out)


SHOWN_FAILURES = 8     # per exercise: with its header and notes, feedback stays within 40 lines


def _failures_md(failing: list[dict]) -> list[str]:
    """One line per failing test, the first SHOWN_FAILURES of them; an exercise not attempted, one line."""
    if failing and all("NotImplementedError: exercise " in f["message"] for f in failing):
        return [f"- not solved yet: all {len(failing)} tests stop at `{failing[0]['message'][:120]}`"]
    out = [f"- `{f['test']}` — {f['outcome']}: {f['message'] or '(no message)'}"
           for f in failing[:SHOWN_FAILURES]]
    if len(failing) > SHOWN_FAILURES:
        out.append(f"- … and {len(failing) - SHOWN_FAILURES} more failing tests (run "
                   f"`python -m pytest --exercise ID` to see them all)")
    return out


def format_markdown(report: SubmissionReport) -> str:
    """Feedback an instructor can hand back: scores, then each failing test with its short message."""
    name = Path(report.submission).name
    out = [f"# Grade: {name}", "",
           (f"Status: {report.status} in {report.seconds:.0f} s. Overall score: **{report.total_score:.2f}** "
            f"(the mean of the exercises' scores; a score counts the tests that reach only that "
            f"exercise)."), "",
           f"Graded with {environment_line(report.environment)}.", "",
           "| exercise | own tests passed | skipped | score |", "|---|---|---|---|"]
    out += [f"| `{r.exercise}` | {r.passed}/{r.total} | {r.skipped} | {r.score:.2f} |"
            for r in report.exercises]
    if report.integration:
        out += ["", "Integration tests (they reach several exercises; reported, not scored):", "",
                "| exercises | passed | skipped |", "|---|---|---|"]
        out += [f"| {g.name} | {g.passed}/{g.total} | {g.skipped} |" for g in report.integration]
    for r in report.exercises:
        if r.failing or r.error or r.skip_reasons:
            out += ["", f"## `{r.exercise}`", ""]
            if r.error:
                out.append(f"Note: {r.error}")
            out += [line.replace("--exercise ID", f"--exercise {r.exercise}")
                    for line in _failures_md(r.failing)]
            out += [f"- skipped: {reason}" for reason in r.skip_reasons[:3]]
    failing_groups = [g for g in report.integration if g.failing]
    if failing_groups:
        out += ["", "## Integration tests", ""]
        for g in failing_groups:
            out += [f"**{g.name}**", ""] + _failures_md(g.failing) + [""]
    if report.log_tail:
        out += ["", "pytest's output:", "", "```", report.log_tail, "```"]
    return "\n".join(out).rstrip("\n") + "\n"


def student_names(submissions: list[Path]) -> list[str]:
    """A distinct name per submission: its folder's name, or with its parent's (a/alice, b/alice ->
    a-alice, b-alice), or numbered if even that repeats."""
    paths = [Path(s) for s in submissions]
    names = [p.name for p in paths]
    names = [f"{p.parent.name}-{p.name}" if names.count(p.name) > 1 else p.name for p in paths]
    return [f"{n}-{names[:i].count(n) + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]


OUTPUTS_RECORD = ".minidist-grade-outputs.json"   # {file name: sha256} of what grading wrote in a folder


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _written(folder: Path) -> dict[str, str]:
    record = folder / OUTPUTS_RECORD
    try:
        return json.loads(record.read_text()) if record.is_file() else {}
    except (OSError, ValueError):
        return {}


def check_outputs(paths: list[Path]) -> None:
    """Before grading: each output's folder exists, and no output would replace a file the grader did not
    write (a file is the grader's if the folder's record holds it with its current content). ValueError
    naming the path otherwise."""
    for path in map(Path, paths):
        if not path.parent.is_dir():
            raise ValueError(f"cannot write {path}: the folder {path.parent} does not exist")
        if path.is_dir():
            raise ValueError(f"cannot write {path}: it is a folder")
        if path.exists() and _written(path.parent).get(path.name) != _digest(path):
            raise ValueError(f"{path} exists and was not written by the grader: refusing to overwrite it "
                             f"(move it, or choose another --out / --csv)")


def write_output(path: Path, text: str) -> None:
    """Write a grading output and record it as the grader's (so a later grade may replace it)."""
    path = Path(path)
    path.write_text(text)
    record = _written(path.parent)
    record[path.name] = _digest(path)
    (path.parent / OUTPUTS_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def csv_text(reports: list[SubmissionReport], names: list[str] | None = None) -> str:
    """One row per submission: status, time, overall score, each exercise's score, totals."""
    ids = sorted({r.exercise for rep in reports for r in rep.exercises})
    names = names or student_names([Path(rep.submission) for rep in reports])
    with io.StringIO(newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "status", "seconds", "score", *ids, "own_passed", "own_run", "skipped",
                         "hung_or_crashed", "integration_passed", "integration_run"])
        for name, rep in zip(names, reports, strict=True):
            by_id = {r.exercise: r for r in rep.exercises}
            writer.writerow([name, rep.status, rep.seconds, rep.total_score,
                             *[by_id[i].score if i in by_id else "" for i in ids],
                             sum(r.passed for r in rep.exercises), sum(r.total for r in rep.exercises),
                             sum(r.skipped for r in rep.exercises), len(rep.incidents),
                             sum(g.passed for g in rep.integration), sum(g.total for g in rep.integration)])
        return f.getvalue()


def write_csv(reports: list[SubmissionReport], path: Path, names: list[str] | None = None) -> None:
    write_output(path, csv_text(reports, names))
