"""``python -m minidist plan --mode minidist`` (minidist/plan/minidist_plan.py): the table's numbers are
the library's minidist-mode prediction, ranked; ``--measure`` prints the run beside, equal; bad input is
refused."""

import pytest

from minidist.__main__ import main
from minidist.cluster import Device, LinkModel
from minidist.plan.minidist_plan import plan_minidist
from minidist.plan.model import ModelSpec

from .layout_count import brute_force_layouts

SPEC = ModelSpec(layers=2, d_model=8, heads=2, seq=8, batch=8, vocab=11)
ARGS = ["plan", "--mode", "minidist", "--layers", "2", "--d-model", "8", "--heads", "2", "--seq", "8",
        "--batch", "8", "--vocab", "11", "--flops", "1e9", "--alpha", "1e-6", "--beta", "2e-10"]
DEVICE, LINK = Device(flops=1e9), LinkModel(alpha=1e-6, beta=2e-10)


def rows(out: str) -> dict[tuple[str, int], list[float]]:
    """(layout name, M) -> the numbers of its row (M, states, activ, peak, step[, run step, run peak])."""
    table = {}
    for line in out.splitlines()[3:]:
        if not line.strip():
            break
        numbers = [float(v) for v in line[34:].split()]
        table[line[:34].strip(), int(numbers[0])] = numbers
    return table


def key(p) -> tuple[str, int]:
    return p.layout.name(), p.layout.micro_batches


def test_plan_cli_minidist_mode_prints_the_library_prediction(capsys):
    assert main([*ARGS, "--devices", "8", "--top", "100"]) == 0
    table = rows(capsys.readouterr().out)
    plans = plan_minidist(SPEC, 8, DEVICE, LINK)
    on_eight = [lay for lay in brute_force_layouts(SPEC.layers, SPEC.heads, SPEC.ff, SPEC.seq, SPEC.batch)
                if lay[0] * lay[1] * lay[2] * lay[3] * lay[4] == 8]                 # 74 today
    assert list(table) == [key(p) for p in plans] and len(plans) == len(on_eight)
    for p in plans:
        q = p.predicted
        expected = [p.layout.micro_batches, q["states"] / 1e3, q["activations"] / 1e3, q["peak"] / 1e3,
                    q["seconds"] * 1e6]
        assert table[key(p)] == pytest.approx(expected, abs=0.006)
    steps = [numbers[4] for numbers in table.values()]
    assert steps == sorted(steps)


def test_plan_cli_minidist_mode_measures_beside(capsys):
    assert main([*ARGS, "--devices", "2", "--measure", "--top", "100"]) == 0
    out = capsys.readouterr().out
    assert "run: step us" in out
    table = rows(out)
    on_two = [lay for lay in brute_force_layouts(SPEC.layers, SPEC.heads, SPEC.ff, SPEC.seq, SPEC.batch)
              if lay[0] * lay[1] * lay[2] * lay[3] * lay[4] == 2]                   # 23 today
    assert len(table) == len(on_two) and all(len(numbers) == 7 for numbers in table.values())
    for numbers in table.values():          # the run equals the prediction (test_plan_minidist_mode.py)
        assert numbers[5:] == numbers[3:5][::-1]


def test_plan_cli_minidist_mode_excludes_what_does_not_fit(capsys):
    assert main([*ARGS, "--devices", "2", "--memory", "0.00016", "--top", "100"]) == 0   # 160 kB
    out = capsys.readouterr().out
    plans = plan_minidist(SPEC, 2, Device(flops=1e9, memory=160_000), LINK)
    fits = [p for p in plans if p.excluded is None]
    out_ = [q for q in plans if q.excluded]
    assert all(p.predicted["peak"] <= 160_000 < q.predicted["peak"] for p in fits for q in out_)
    assert list(rows(out)) == [key(p) for p in fits] and 0 < len(fits) < len(plans)
    assert f"{len(fits)} layouts fit, {len(plans) - len(fits)} do not" in out
    assert "dp2" + " " * 32 + "does not fit: 162.6 kB > 160.0 kB" in out             # dp2 with M = 1


def test_plan_cli_minidist_mode_prices_a_switch_model_and_zero1(capsys):
    switch = ["--d-ff", "16", "--experts", "2", "--top-k", "2"]
    assert main([*ARGS, *switch, "--devices", "4", "--zero1", "--measure", "--top", "100"]) == 0
    out = capsys.readouterr().out
    assert "2 blocks with 2 experts (every token to each)" in out
    table = rows(out)
    spec = ModelSpec(2, 8, 2, 8, 8, 11, d_ff=16, experts=2, top_k=2)
    plans = plan_minidist(spec, 4, DEVICE, LINK, zero1=True)
    assert list(table) == [key(p) for p in plans]
    assert set(table) == {("dp2 ep2 zero1", 1), ("dp2 ep2 zero1", 2)}
    for numbers in table.values():          # the run equals the prediction (test_plan_minidist_switch.py)
        assert numbers[5:] == numbers[3:5][::-1]


@pytest.mark.parametrize("bad, message", [(["--d-ff", "16"], "d_ff = 4"),
                                          (["--experts", "2"], "--top-k must equal --experts")])
def test_plan_cli_minidist_mode_refuses_other_models(bad, message, capsys):
    with pytest.raises(SystemExit) as stop:                 # a usage error: one line, exit status 2
        main([*ARGS, "--devices", "2", *bad])
    assert stop.value.code == 2 and message in capsys.readouterr().err
