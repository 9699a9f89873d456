"""``python -m minidist exercises list | make DEST [--only ids] | grade SUBMISSION [--json] | map``."""

from __future__ import annotations

import json
from pathlib import Path

from .exercise_map import build_map, load_map
from .grade import as_json_ready, grade
from .markers import all_regions, read_registry
from .student_copy import make_student_copy

REPO_ROOT = Path(__file__).resolve().parents[2]


def _ids(text: str | None) -> list[str] | None:
    return [part.strip() for part in text.split(",") if part.strip()] if text else None


def cmd_list(args) -> int:
    registry = read_registry(args.root)
    regions = all_regions(args.root)
    reached: dict[str, int] = {}
    for ids in load_map(args.root).values():
        for ex in ids:
            reached[ex] = reached.get(ex, 0) + 1
    for ex_id, ex in registry.items():
        where = sorted({f"{r.path}:{r.function}" for r in regions if r.exercise == ex_id})
        print(f"{ex_id:28s} {reached.get(ex_id, 0):3d} tests  {ex.lesson:28s} {', '.join(where)}")
        print(f"{'':28s} {ex.statement}")
    return 0


def cmd_make(args) -> int:
    cut = make_student_copy(args.root, Path(args.dest), only=_ids(args.only))
    print(f"student copy written to {args.dest}; exercises cut: {', '.join(cut)}")
    return 0


def cmd_grade(args) -> int:
    results = grade(Path(args.submission), args.root, exercises=_ids(args.only),
                    hidden=Path(args.hidden) if args.hidden else None, timeout=args.timeout,
                    tests=_ids(args.tests))
    if args.json:
        print(json.dumps(as_json_ready(results), indent=1))
        return 0
    for r in results:
        note = f"  ({r.error.splitlines()[0]})" if r.error else ""
        print(f"{r.exercise:28s} {r.passed:3d}/{r.total:<3d} score {r.score:.2f}{note}")
    print(f"{'overall':28s}         score {as_json_ready(results)['total_score']:.2f}")
    return 0


def cmd_map(args) -> int:
    mapping = build_map(args.root)
    print(f"tests/exercise_map.json: {len(mapping)} tests reach an exercise region")
    return 0


def add_parser(sub) -> None:
    """Register `exercises ...` on the top-level command line's sub-parsers."""
    ex = sub.add_parser("exercises", help="list, make a student copy, grade, map tests to exercises")
    ex.set_defaults(root=REPO_ROOT)
    verbs = ex.add_subparsers(dest="verb", required=True)
    verbs.add_parser("list", help="the exercises, their lessons and files").set_defaults(func=cmd_list)
    make = verbs.add_parser("make", help="write a student copy with solutions cut out")
    make.add_argument("dest")
    make.add_argument("--only", help="comma-separated exercise ids (default: all)")
    make.set_defaults(func=cmd_make)
    gr = verbs.add_parser("grade", help="grade a student copy with the reference tests")
    gr.add_argument("submission")
    gr.add_argument("--only", help="comma-separated exercise ids (default: all)")
    gr.add_argument("--hidden", help="a directory of extra (hidden) test files")
    gr.add_argument("--timeout", type=float, default=120.0, help="seconds per test (default 120)")
    gr.add_argument("--tests", help="comma-separated test paths to limit grading to (default: all that reach)")
    gr.add_argument("--json", action="store_true", help="machine-readable output")
    gr.set_defaults(func=cmd_grade)
    verbs.add_parser("map", help="re-measure which tests reach which exercise").set_defaults(func=cmd_map)


