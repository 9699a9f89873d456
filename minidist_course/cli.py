"""``python -m minidist exercises list | make | grade | autograder | check | map`` (lessons/TEACHING.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from minidist.nn.checks import count_option, seconds_option

from . import gradescope, questions
from .catalog import locations, render_markdown
from .classroom import grade_class
from .exercise_map import build_map, own_exercise
from .isolation import check_each_alone, own_tests
from .markers import MarkerError, all_regions, read_registry
from .options import OptionError
from .options import exercise_ids as _ids
from .report import check_outputs, format_markdown, format_text, student_names, write_csv, write_output
from .student_copy import STUDENT_STAMP, make_student_copy

REPO_ROOT = Path(__file__).resolve().parents[1]


STUDENT_COPY_NOTE = """\
exercises {verb}: this is a student copy of the course: its solutions are cut out, so there is nothing
to {what} here ({why}). Instructors run `exercises {verb}` in the reference repository. To check your own
work: `python -m pytest --exercise NAME` (one exercise; lessons/EXERCISES.md lists them) or
`python -m pytest` (everything: what is left fails)."""
WHAT = {"make": "cut", "grade": "grade against", "check": "check", "map": "map", "standins": "replace",
        "mutants": "mutate", "list": "list", "autograder": "grade against"}


def _reference_only(func):
    """A verb that needs the reference tree: in a student copy, or on broken markers, a clear message and
    exit status 2 instead of a traceback."""
    def run(args) -> int:
        try:
            if (args.root / STUDENT_STAMP).exists() or not all_regions(args.root):
                why = "it has no `# BEGIN SOLUTION` region"
                print(STUDENT_COPY_NOTE.format(verb=args.verb, what=WHAT[args.verb], why=why),
                      file=sys.stderr)
                return 2
            return func(args)
        except OptionError as err:
            print(f"exercises {args.verb}: {err}", file=sys.stderr)
            return 2
        except MarkerError as err:
            print(f"exercises {args.verb}: the solution markers are not right: {err}", file=sys.stderr)
            return 2
    return run


def cmd_list(args) -> int:
    if args.weeks:
        from .catalog import week_table

        sys.stdout.write(week_table(read_registry(args.root)))
        return 0
    if args.markdown and not all_regions(args.root):
        print("exercises list --markdown: this copy has no solution regions to list; lessons/EXERCISES.md "
              "is the list (`exercises list` prints it with each exercise's tests)", file=sys.stderr)
        return 2
    if args.markdown:
        sys.stdout.write(render_markdown(args.root))
        return 0
    from .own_tests import reached  # the marks `pytest --exercise` and the grader see

    registry, regions = read_registry(args.root), all_regions(args.root)
    own = {ex: len(tests) for ex, tests in own_tests(args.root).items()}
    mapping = reached(args.root)
    shared: dict[str, int] = {}
    for ids in mapping.values():
        for ex in set(ids) if own_exercise(ids) is None else ():
            shared[ex] = shared.get(ex, 0) + 1
    for ex_id, ex in registry.items():
        print(f"{ex_id:28s} {own.get(ex_id, 0):3d} own tests, {shared.get(ex_id, 0):3d} integration  "
              f"{ex.lesson:28s} {locations(regions, ex_id)}")
        print(f"{'':28s} {ex.statement}")
    alone = sum(own_exercise(ids) is not None for ids in mapping.values())
    own_left = sum(own.values())
    print(f"{len(mapping)} tests reach an exercise: {alone} reach one ({alone - own_left} of them pass on a "
          f"stand-in or need an extra they cannot use here, and are left out: {own_left} own tests), "
          f"{len(mapping) - alone} integration")
    return 0


def cmd_make(args) -> int:
    cut = make_student_copy(args.root, Path(args.dest), only=_ids(args.only),
                            keep=_ids(args.keep, "--keep"), hints=args.hints)
    print(f"student copy written to {args.dest}; exercises cut: {', '.join(cut) or '(none)'}")
    return 0


def grade_outputs(args, names: list[str]) -> list[Path]:
    """The files ``--out`` and ``--csv`` will write, checked before any grading (report.check_outputs):
    ValueError if one cannot be written or would replace a file the grader did not write."""
    paths = []
    if args.out:
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} is a file: give a folder for the NAME.md and NAME.json files")
        if any(p.exists() and not p.is_dir() for p in out.parents):
            raise ValueError(f"--out {out}: a file stands where a folder of its path should be")
        if out.is_dir():                        # a new folder holds nothing to overwrite
            paths += [out / f"{name}.{ext}" for name in names for ext in ("md", "json")]
    if args.csv:
        paths.append(Path(args.csv))
    check_outputs(paths)
    return paths


class Progress:
    """A bar of the grading sessions done (tqdm, on stderr) while stdout is a terminal; the lines per
    student are printed above it, or alone when there is no bar (a log, a pipe, CI)."""

    def __init__(self):
        self.bar = None
        if sys.stdout.isatty():
            try:
                from tqdm import tqdm  # the [test] extra, which grading needs in any case
                self.bar = tqdm(total=0, unit="session", desc="grading", file=sys.stderr, leave=False)
            except ImportError:
                pass

    def echo(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def update(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.total = total
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_grade(args) -> int:
    submissions = [Path(s) for s in args.submissions]
    if args.gradescope:                       # one submission, perhaps unpacked one folder deep
        if len(submissions) != 1:
            print(f"exercises grade: --gradescope grades one submission; got {len(submissions)}",
                  file=sys.stderr)
            return 2
        submissions = [gradescope.find_copy(submissions[0])]
    names = student_names(submissions)
    progress = Progress()
    try:
        grade_outputs(args, names)
        reports = grade_class(submissions, args.root, exercises=_ids(args.only),
                              hidden=Path(args.hidden) if args.hidden else None, timeout=args.timeout,
                              limit=args.limit, jobs=args.jobs, integration=args.integration,
                              echo=progress.echo, progress=progress.update)
    except ValueError as err:
        print(f"exercises grade: {err}", file=sys.stderr)
        if args.gradescope and not isinstance(err, OptionError):   # the student sees why: nothing graded
            gradescope.write_refused(Path(args.gradescope), args.root, args.only, str(err))
        return 2
    finally:
        progress.close()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        for name, report in zip(names, reports, strict=True):
            write_output(Path(args.out) / f"{name}.md", format_markdown(report))
            write_output(Path(args.out) / f"{name}.json", json.dumps(report.as_dict(), indent=1) + "\n")
    if args.gradescope:
        gradescope.write_results(Path(args.gradescope), gradescope.results_json(reports[0]))
    if args.csv:
        write_csv(reports, Path(args.csv), names)
        print(f"scores written to {args.csv}", file=sys.stderr)
    if args.json:
        data = [r.as_dict() for r in reports]
        print(json.dumps(data[0] if len(data) == 1 else data, indent=1))
    elif args.markdown:
        print("\n".join(format_markdown(r) for r in reports), end="")
    elif not args.csv or len(reports) == 1:
        print("\n\n".join(format_text(r) for r in reports))
    return 0 if all(r.status == "graded" for r in reports) else 1


def cmd_check(args) -> int:
    results = check_each_alone(args.root, _ids(args.only), jobs=args.jobs, limit=args.limit)
    return 0 if all(r.ok for r in results) else 1


def cmd_standins(args) -> int:
    from .standins import MAX_SCORE, STANDINS_PATH, grade_standins, problems, write_standin_tests

    results = grade_standins(args.root, jobs=args.jobs, every_test=args.write)
    if args.write:
        weak = write_standin_tests(args.root, results)
        print(f"{STANDINS_PATH}: {sum(map(len, weak.values()))} tests pass on a stand-in of the exercise "
              f"they reach; they are left out of its own tests")
        results = {k: (0, r - p, []) for k, (p, r, _t) in results.items()}
    found = problems(results)
    for line in found:
        print(f"FAIL {line}")
    print(f"stand-ins (identity, zeros, rank 0's input) score at most {MAX_SCORE:.0%} of every exercise's "
          f"own tests" if not found else f"{len(found)} problem(s): run `python -m minidist exercises "
          f"standins --write` after `exercises map`, or strengthen the tests")
    return 1 if found else 0


def cmd_mutants(args) -> int:
    from .mutants import MAX_SCORE, grade_mutants

    try:
        results = grade_mutants(args.root, _ids(args.only), jobs=args.jobs)
    except ValueError as err:
        print(f"exercises mutants: {err}", file=sys.stderr)
        return 2
    bad = [m for m, r in results if r.score > MAX_SCORE or not r.total]
    print(f"{len(results) - len(bad)}/{len(results)} mutants score at most {MAX_SCORE:.0%} of their exercise"
          + (f"; too high: {', '.join(f'{m.exercise} ({m.kind})' for m in bad)}" if bad else ""))
    return 1 if bad else 0


def cmd_map(args) -> int:
    from .standins import STANDINS_PATH, grade_standins, write_standin_tests

    mapping = build_map(args.root)
    print(f"tests/exercise_map.json: {len(mapping)} tests reach an exercise region")
    # Which of them pass on a trivially wrong stand-in depends on the map: measure it with it.
    weak = write_standin_tests(args.root, grade_standins(args.root, every_test=True, echo=lambda line: None))
    print(f"{STANDINS_PATH}: {sum(map(len, weak.values()))} of them pass on a stand-in of the exercise they "
          f"reach (left out of its own tests)")
    return 0


def add_parser(sub) -> None:
    """Register `exercises ...` on the top-level command line's sub-parsers."""
    ex = sub.add_parser("exercises", help="list, make a student copy, grade, check, map tests to exercises")
    ex.set_defaults(root=REPO_ROOT)
    verbs = ex.add_subparsers(dest="verb", required=True)
    ls = verbs.add_parser("list", help="the exercises, their lessons, files and tests")
    ls.add_argument("--markdown", action="store_true", help="print lessons/EXERCISES.md")
    ls.add_argument("--weeks", action="store_true", help="print the week table of lessons/TEACHING.md")
    ls.set_defaults(func=cmd_list)
    make = verbs.add_parser("make", help="write a student copy with solutions cut out")
    make.add_argument("dest")
    make.add_argument("--only", action="append", metavar="ID", help="cut only these (repeatable or a,b)")
    make.add_argument("--keep", action="append", metavar="ID", help="leave these solved (repeatable or a,b)")
    make.add_argument("--hints", choices=("none", "outline", "full"), default="outline",
                      help="what a cut region tells: none, outline (the statement and idea; default) or "
                           "full (and the region's hints)")
    make.set_defaults(func=_reference_only(cmd_make))
    gr = verbs.add_parser("grade", help="grade student copies with the reference tests")
    gr.add_argument("submissions", nargs="+", help="one or more student copies (e.g. SUBMISSIONS/*)")
    gr.add_argument("--only", action="append", metavar="ID", help="grade only these exercises")
    gr.add_argument("--hidden", help="a directory of extra (hidden) test files")
    gr.add_argument("--timeout", type=seconds_option, default=30.0,
                    help="seconds one test may run before it is killed and counted hung (default 30)")
    gr.add_argument("--limit", type=seconds_option, default=300.0, help="seconds per exercise (default 300)")
    gr.add_argument("--jobs", type=count_option(1), default=2, help="pytest sessions at a time (default 2)")
    gr.add_argument("--integration", action="store_true",
                    help="also run the integration tests (they reach several exercises; never scored)")
    gr.add_argument("--json", action="store_true", help="the full report as JSON")
    gr.add_argument("--markdown", action="store_true", help="feedback as Markdown: failing tests, messages")
    gr.add_argument("--csv", help="write one row per submission to this file")
    gr.add_argument("--out", help="write NAME.md and NAME.json per submission into this directory")
    gr.add_argument("--gradescope", metavar="RESULTS_JSON",
                    help="write Gradescope's results.json of the (one) submission to this file")
    gr.set_defaults(func=_reference_only(cmd_grade))
    gradescope.add_autograder_parser(verbs, _reference_only)
    ck = verbs.add_parser("check", help="CI: each exercise, solved alone, passes its own tests")
    ck.add_argument("--only", action="append", metavar="ID", help="check only these exercises")
    ck.add_argument("--jobs", type=count_option(1), default=2, help="copies checked at a time (default 2)")
    ck.add_argument("--limit", type=seconds_option, default=900.0, help="seconds per exercise (default 900)")
    ck.set_defaults(func=_reference_only(cmd_check))
    mp = verbs.add_parser("map", help="re-measure which tests reach which exercise "
                                      "(and which pass on stand-ins)")
    mp.set_defaults(func=_reference_only(cmd_map))
    mu = verbs.add_parser("mutants", help="CI: wrong non-trivial solutions score at most 50%% of their "
                                          "exercise")
    mu.add_argument("--only", action="append", metavar="ID", help="only these exercises' mutants")
    mu.add_argument("--jobs", type=count_option(1), default=2, help="sessions at a time (default 2)")
    mu.set_defaults(func=_reference_only(cmd_mutants))
    st = verbs.add_parser("standins", help="CI: trivially wrong solutions score at most 10%% of own tests")
    st.add_argument("--write", action="store_true",
                    help="measure anew and record the tests that pass on a stand-in "
                         "(tests/exercise_standins.json)")
    st.add_argument("--jobs", type=count_option(1), default=2, help="sessions at a time (default 2)")
    st.set_defaults(func=_reference_only(cmd_standins))
    questions.add_parser(verbs)
