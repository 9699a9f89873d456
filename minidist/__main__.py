"""Command line: ``python -m minidist <command>``.

    demo            train a small model on the digits and report what happened
    lessons         list the lesson scripts
    run NN          run lessons/NN_*.py (--mpi P: on P MPI processes)
    exercises ...   list | make DEST | grade SUBMISSION... | check | map   (instructors: lessons/TEACHING.md)
    plan ...        predict memory and step time of every parallel layout for a model and a cluster
    train ...       train a small GPT on the help() text in any layout (--check: against one process)
    book OUT        execute every lesson as a notebook into a static site at OUT (the [notebook] extra)

exercises and book are the classroom's (the package minidist_course/ beside the textbook): this file is the
one place the textbook reaches it, and only when the command line is built or one of them runs.
"""

from __future__ import annotations

import argparse
import glob
import os
import runpy
import sys

from minidist.nn.checks import count_option

LESSONS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lessons")


def lesson_paths() -> list[str]:
    return sorted(glob.glob(os.path.join(LESSONS_DIR, "[0-9][0-9]_*.py")))


def cmd_lessons(_args) -> int:
    paths = lesson_paths()
    if not paths:
        print(f"no lessons found in {LESSONS_DIR}")
        return 1
    for path in paths:
        with open(path) as f:
            first = next((line for line in f if line.startswith("# #")), "# # (untitled)")
        print(f"{os.path.basename(path)[:2]}  {os.path.basename(path):28s} {first[3:].strip()}")
    return 0


def cmd_run(args) -> int:
    matches = [p for p in lesson_paths() if os.path.basename(p).startswith(args.number.zfill(2) + "_")]
    if not matches:
        print(f"no lesson {args.number!r}; `python -m minidist lessons` lists them", file=sys.stderr)
        return 2
    if args.mpi is not None:                       # on P MPI processes (minidist/cluster/mpi_launch.py)
        from minidist.cluster.mpi_launch import launch
        return launch(args.mpi, [matches[0]]).returncode
    sys.argv = [matches[0]]

    def lesson() -> int:
        runpy.run_path(matches[0], run_name="__main__")
        return 0

    return _stop_kindly_if_unsolved("This lesson", "the lesson", lesson)


def cmd_demo(_args) -> int:
    from minidist.recipes.demo import main as demo_main

    return _stop_kindly_if_unsolved("The demo", "the demo", demo_main)


def cmd_train(args) -> int:
    from minidist.recipes.train import cmd_train as train

    return _stop_kindly_if_unsolved("The training recipe", "the command", lambda: train(args))


def _stop_kindly_if_unsolved(subject: str, rerun: str, run) -> int:
    """Run ``run()``; in a student copy, an unsolved exercise ends it with the message a lesson run
    directly prints (minidist/__init__.py), exit status 1, instead of a traceback."""
    from minidist_course.unsolved import stop_message, unsolved_exercise

    try:
        return run() or 0
    except BaseException as error:
        exercise = unsolved_exercise(error)
        if exercise is None:
            raise
        print(stop_message(subject, rerun, exercise), flush=True)
        return 1


def cmd_book(args) -> int:
    from minidist_course.book import check_output, lessons

    try:                                  # bad input refused before anything runs or is written
        paths = lessons(only=args.only)
        check_output(args.out, ["index.html", *(f"{p.stem}.html" for p in paths)])
    except ValueError as err:
        print(f"python -m minidist book: error: {err}", file=sys.stderr)
        return 2
    try:
        import jupytext  # noqa: F401  (the [notebook] extra)
        import latex2mathml  # noqa: F401
        import nbclient  # noqa: F401
        import nbconvert  # noqa: F401
        import tqdm  # noqa: F401

        from minidist_course.book import LessonFailed, build_book
    except ImportError as err:
        print(f"book needs the notebook extra ({err.name} is missing): pip install -e \".[notebook]\"",
              file=sys.stderr)
        return 2
    try:
        pages = build_book(args.out, only=args.only)
    except LessonFailed as failed:
        print(f"python -m minidist book: {failed}", file=sys.stderr)
        return 1
    except ValueError as err:                  # OUT could not be made after all (permissions, a race)
        print(f"python -m minidist book: error: {err}", file=sys.stderr)
        return 2
    print(f"{len(pages)} lesson pages and index.html written to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minidist", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="train a small model and report").set_defaults(func=cmd_demo)
    sub.add_parser("lessons", help="list the lessons").set_defaults(func=cmd_lessons)
    run = sub.add_parser("run", help="run one lesson by number")
    run.add_argument("number")
    run.add_argument("--mpi", type=count_option(1, "the number of MPI processes"), metavar="P",
                     help="run it under mpiexec on P processes")
    run.set_defaults(func=cmd_run)
    book = sub.add_parser("book", help="execute the lessons into a static site (HTML pages + index)")
    book.add_argument("out", help="the folder to write index.html and one page per lesson into")
    book.add_argument("--only", action="append", metavar="NN", help="only these lessons (repeatable)")
    book.set_defaults(func=cmd_book)
    from minidist.plan.report import add_parser as add_plan_parser
    from minidist.recipes.train import add_parser as add_train_parser
    from minidist_course.cli import add_parser as add_exercises_parser

    add_exercises_parser(sub)
    add_plan_parser(sub)
    add_train_parser(sub).set_defaults(func=cmd_train)      # in a student copy: stops kindly, as the demo
    args = parser.parse_args(argv)
    return args.func(args)


def run_cli() -> int:
    """main(), quiet when the reader of stdout goes away (``exercises list | head``): no BrokenPipeError
    traceback, as the Python documentation advises (stdout pointed at devnull before the exit flushes it)."""
    try:
        status = main()
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(run_cli())
