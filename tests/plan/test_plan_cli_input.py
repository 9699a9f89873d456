"""python -m minidist plan under bad input (issue 45, items 1-2): every bad option is argparse's one-line
usage error naming the option, exit status 2, at once — never a traceback, a hang, a wrong table."""

import time

import pytest

import minidist.__main__ as cli
from minidist.plan.layouts import divisors
from minidist.plan.options import memory_option

BASE = ["plan", "--layers", "4", "--d-model", "64", "--heads", "4", "--seq", "32", "--batch", "8",
        "--devices", "4"]


def refuse(argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err)
    return err[-1]


@pytest.mark.parametrize("option, value", [
    ("--micro-batch", "0"), ("--micro-batch", "-1"), ("--chunks", "0"), ("--chunks", "-1"),
    ("--layers", "0"), ("--vocab", str(10 ** 400)), ("--memory", "inf"), ("--memory", "nan"),
    ("--memory", "-80GB"), ("--memory", "80 parsecs"), ("--zero", "0,x"), ("--zero", "4"),
    ("--recompute", "none,some"),
])
def test_plan_bad_option_is_one_line_naming_it(option, value, capsys):
    line = refuse(BASE + [option, value, "--schedule", "interleaved"], capsys)
    assert line.startswith("python -m minidist plan: error: ") and f"argument {option}:" in line, line


def test_plan_far_too_many_devices_answers_at_once(capsys):
    start = time.perf_counter()
    line = refuse(BASE[:-1] + ["1000000000000"], capsys)
    assert time.perf_counter() - start < 2
    assert "--devices 1000000000000" in line and "no layout uses more than" in line


def test_plan_divisors_by_trial_division():
    assert all(divisors(n) == [k for k in range(1, n + 1) if n % k == 0] for n in range(1, 300))
    start = time.perf_counter()
    assert len(divisors(10 ** 12)) == 13 * 13 and time.perf_counter() - start < 1


def test_plan_memory_units():
    assert memory_option("80") == memory_option("80GB") == memory_option("80 gb") == 80e9
    assert memory_option("80GiB") == 80 * 2 ** 30 and memory_option("512MiB") == 2 ** 29


def test_plan_every_option_has_a_help_line(capsys):
    with pytest.raises(SystemExit):
        cli.main(["plan", "--help"])
    out = capsys.readouterr().out
    options = [word for word in out.split() if word.startswith("--") and word != "--help"]
    parser_actions = cli_plan_actions()
    assert {a for a in options} >= {"--memory", "--vocab", "--micro-batch"}
    assert all(action.help for action in parser_actions), [a.dest for a in parser_actions if not a.help]


def cli_plan_actions():
    import argparse

    from minidist.plan.report import add_parser
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices["plan"]._actions if a.dest != "help"]
