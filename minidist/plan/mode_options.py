"""The ``plan`` command's arguments once parsed (``check_plan_options``): what argparse lets through is a
one-line error naming the option (exit status 2), never a traceback or an option quietly ignored:

    "--" as a value     argparse drops it: the option holds [] and skips its type= and choices=
    the other mode's    an option only one mode reads, set away from its default in the other mode
                        (``--measure`` in analytic mode, ``--explain`` in minidist mode); an option given
                        at its default value changes nothing and cannot be told apart, so it passes
"""

from __future__ import annotations

import argparse

# the options only one mode reads (their dests; ones this parser lacks are skipped); sizes, --top, --memory:
# both modes'
ONLY = {"analytic": ("topology", "hardware", "precision", "schedule", "zero", "recompute", "fused", "explain",
                     "chunks", "micro_batch", "layout", "json", "attention", "weights"),
        "minidist": ("flops", "alpha", "beta", "measure", "zero1")}


def record_mode_defaults(parser: argparse.ArgumentParser) -> None:
    """Keep the defaults of the one-mode options on the parsed arguments, for ``check_plan_options``."""
    parser.set_defaults(mode_defaults={dest: parser.get_default(dest) for dest in sum(ONLY.values(), ())})


def check_plan_options(args: argparse.Namespace) -> None:
    """ValueError naming the option: one given "--" (a list: no option of ``plan`` takes several values),
    or one of the mode not chosen set away from its default (``record_mode_defaults``)."""
    for dest, value in vars(args).items():
        if isinstance(value, list):
            raise ValueError(f"argument --{dest.replace('_', '-')}: expected a value, got '--'")
    other = "minidist" if args.mode == "analytic" else "analytic"
    given = [dest for dest in ONLY[other] if getattr(args, dest, None) != args.mode_defaults.get(dest)]
    if given:
        option = "--eager" if given[0] == "fused" else f"--{given[0].replace('_', '-')}"
        raise ValueError(f"{option} is an option of {other} mode, not read in {args.mode} mode "
                         f"(--mode {other} reads it)")
