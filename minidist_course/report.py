"""Grades written out: a table for the terminal, Markdown feedback for a student, CSV for a class."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
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
        broken = ", ".join(r.broken_promises())
        note = f"  ({r.error})" if r.error else (f"  (promise broken: {broken})" if broken else "")
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


MAX_LINES = 40          # a student's feedback, all of it
CUT = "NotImplementedError: exercise "
ORACLE_SKIP = re.compile(r"could not import '([\w.]+)'")


def _ids(ids: list[str]) -> str:
    return ", ".join(f"`{i}`" for i in ids)


def _first_failure(r) -> str:
    """The first real failure of an exercise (hung, crashed and failed before not run; the cut last)."""
    order = {"failed": 0, "hung": 1, "crashed": 1, "not run": 2}
    real = sorted((f for f in r.failing if CUT not in f["message"]), key=lambda f: order[f["outcome"]])
    if not real:
        return ""
    f = real[0]
    message = " ".join(f["message"].split()) or "(no message)"
    name = f["test"].split("::", 1)[-1]
    return f"`{name}` {f['outcome']}: {message[:160]}"


def _skip_line(report: SubmissionReport) -> str:
    """One line for every skip: which oracle was missing, how many tests it skipped, how to install it."""
    skipped = sum(r.skipped for r in report.exercises)
    reasons = [reason for r in report.exercises for reason in r.skip_reasons]
    oracles = {m[1] for reason in reasons if (m := ORACLE_SKIP.search(reason))}
    if not skipped:
        return ""
    missing = f" because {', '.join(sorted(oracles))} is not installed (`pip install -e \".[oracle]\"`)" \
        if oracles else ""
    return f"{skipped} tests were skipped{missing}; skipped tests count neither way."


def format_markdown(report: SubmissionReport) -> str:
    """Feedback for a student, at most MAX_LINES lines: scores, then per exercise not at full marks its
    first real failure; exercises at full marks and exercises not attempted on one line each."""
    name = Path(report.submission).name
    out = [f"# Grade: {name}", "",
           f"Status: {report.status} in {report.seconds:.0f} s. Overall score: **{report.total_score:.2f}** "
           f"(the mean of the exercises' scores; each exercise is scored by the tests that reach only it, by "
           f"promise where its statement makes several).",
           f"Graded with {environment_line(report.environment)}."]
    if skip := _skip_line(report):
        out.append(skip)
    full = [r.exercise for r in report.exercises if r.total and r.score == 1.0 and not r.error]
    unsolved = [r.exercise for r in report.exercises if not r.error and r.failing
                and all(CUT in f["message"] for f in r.failing)]
    rest = [r for r in report.exercises if r.exercise not in full and r.exercise not in unsolved]
    rest.sort(key=lambda r: (not (r.error or _first_failure(r)), r.score))      # real failures first
    if full or unsolved:
        out.append("")
    if full:
        out.append(f"Full marks ({len(full)}): {_ids(full)}.")
    if unsolved:
        out.append(f"Not solved yet ({len(unsolved)}: every test stops at the exercise's "
                   f"NotImplementedError): {_ids(unsolved)}.")
    if rest:
        out += ["", "| exercise | passed | score | first failure (run `python -m pytest --exercise ID`) |",
                "|---|---|---|---|"]
        for r in rest:
            why = (f"code not taken: {r.error}" if r.error else "") or _first_failure(r)
            why = f"promise broken: {', '.join(r.broken_promises())}. {why}" if r.broken_promises() else why
            out.append(f"| `{r.exercise}` | {r.passed}/{r.total} | {r.score:.2f} | {why.replace('|', '/')} |")
    for i in report.incidents[:3]:
        out.append(f"- {i['outcome']} in `{i['exercise']}`: `{i['test'].split('::', 1)[-1]}`")
    if report.integration:
        summary = "; ".join(f"{g.name} {g.passed}/{g.total}" for g in report.integration)
        out += ["", f"Integration tests (not scored): {summary}."]
    if report.log_tail:
        out += ["", "pytest's output (end):", "", "```", *report.log_tail.splitlines()[-6:], "```"]
    if len(out) > MAX_LINES:
        left = len(out) - MAX_LINES + 1
        out = out[:MAX_LINES - 1] + [f"(… {left} more lines: the grade's JSON file has every test)"]
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
