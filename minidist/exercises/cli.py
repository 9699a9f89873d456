"""``python -m minidist exercises list | make | grade | check | map`` (see lessons/TEACHING.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .catalog import locations, render_markdown
from .classroom import grade_class
from .exercise_map import build_map, load_map, own_exercise
from .isolation import check_each_alone
from .markers import all_regions, read_registry
from .report import format_markdown, format_text, write_csv
from .student_copy import make_student_copy

REPO_ROOT = Path(__file__).resolve().parents[2]


def _ids(values: list[str] | None) -> list[str] | None:
    """Repeatable options that also take comma-separated lists: ["a,b", "c"] -> ["a", "b", "c"]."""
    if not values:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def cmd_list(args) -> int:
    if args.markdown:
        sys.stdout.write(render_markdown(args.root))
        return 0
    registry, regions = read_registry(args.root), all_regions(args.root)
    own: dict[str, int] = {}
    shared: dict[str, int] = {}
    for ids in load_map(args.root).values():
        counts = own if own_exercise(ids) else shared
        for ex in set(ids):
            counts[ex] = counts.get(ex, 0) + 1
    for ex_id, ex in registry.items():
        print(f"{ex_id:28s} {own.get(ex_id, 0):3d} own tests, {shared.get(ex_id, 0):3d} integration  "
              f"{ex.lesson:28s} {locations(regions, ex_id)}")
        print(f"{'':28s} {ex.statement}")
    return 0


def cmd_make(args) -> int:
    cut = make_student_copy(args.root, Path(args.dest), only=_ids(args.only), keep=_ids(args.keep))
    print(f"student copy written to {args.dest}; exercises cut: {', '.join(cut) or '(none)'}")
    return 0


def cmd_grade(args) -> int:
    def echo(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        reports = grade_class([Path(s) for s in args.submissions], args.root, exercises=_ids(args.only),
                              hidden=Path(args.hidden) if args.hidden else None, timeout=args.timeout,
                              limit=args.limit, jobs=args.jobs, integration=args.integration, echo=echo)
    except ValueError as err:
        print(f"exercises grade: {err}", file=sys.stderr)
        return 2
    for report in reports:
        name = Path(report.submission).name
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{name}.md").write_text(format_markdown(report))
            (out / f"{name}.json").write_text(json.dumps(report.as_dict(), indent=1) + "\n")
    if args.csv:
        write_csv(reports, Path(args.csv))
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


def cmd_map(args) -> int:
    mapping = build_map(args.root)
    print(f"tests/exercise_map.json: {len(mapping)} tests reach an exercise region")
    return 0


def add_parser(sub) -> None:
    """Register `exercises ...` on the top-level command line's sub-parsers."""
    ex = sub.add_parser("exercises", help="list, make a student copy, grade, check, map tests to exercises")
    ex.set_defaults(root=REPO_ROOT)
    verbs = ex.add_subparsers(dest="verb", required=True)
    ls = verbs.add_parser("list", help="the exercises, their lessons, files and tests")
    ls.add_argument("--markdown", action="store_true", help="print lessons/EXERCISES.md")
    ls.set_defaults(func=cmd_list)
    make = verbs.add_parser("make", help="write a student copy with solutions cut out")
    make.add_argument("dest")
    make.add_argument("--only", action="append", metavar="ID", help="cut only these (repeatable or a,b)")
    make.add_argument("--keep", action="append", metavar="ID", help="leave these solved (repeatable or a,b)")
    make.set_defaults(func=cmd_make)
    gr = verbs.add_parser("grade", help="grade student copies with the reference tests")
    gr.add_argument("submissions", nargs="+", help="one or more student copies (e.g. SUBMISSIONS/*)")
    gr.add_argument("--only", action="append", metavar="ID", help="grade only these exercises")
    gr.add_argument("--hidden", help="a directory of extra (hidden) test files")
    gr.add_argument("--timeout", type=float, default=30.0,
                    help="seconds one test may run before it is killed and counted hung (default 30)")
    gr.add_argument("--limit", type=float, default=300.0, help="seconds per exercise (default 300)")
    gr.add_argument("--jobs", type=int, default=2, help="pytest sessions at a time (default 2)")
    gr.add_argument("--integration", action="store_true",
                    help="also run the integration tests (they reach several exercises; never scored)")
    gr.add_argument("--json", action="store_true", help="the full report as JSON")
    gr.add_argument("--markdown", action="store_true", help="feedback as Markdown: failing tests, messages")
    gr.add_argument("--csv", help="write one row per submission to this file")
    gr.add_argument("--out", help="write NAME.md and NAME.json per submission into this directory")
    gr.set_defaults(func=cmd_grade)
    ck = verbs.add_parser("check", help="CI: each exercise, solved alone, passes its own tests")
    ck.add_argument("--only", action="append", metavar="ID", help="check only these exercises")
    ck.add_argument("--jobs", type=int, default=2, help="copies checked at a time (default 2)")
    ck.add_argument("--limit", type=float, default=900.0, help="seconds per exercise (default 900)")
    ck.set_defaults(func=cmd_check)
    verbs.add_parser("map", help="re-measure which tests reach which exercise").set_defaults(func=cmd_map)
