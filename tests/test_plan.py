"""The planner (minidist/plan): its counts equal the library's own models and formulas, its memory follows
the ZeRO paper's arithmetic, its bubbles equal the schedule tables', its exclusions give reasons, and the
command line answers (or refuses bad input clearly)."""

import numpy as np
import pytest

from minidist.__main__ import main
from minidist.cluster import LinkModel
from minidist.cluster.topology import Topology
from minidist.nn import GPT
from minidist.parallel.pipeline.chimera import chimera_schedule
from minidist.parallel.pipeline.interleaved import interleaved_schedule
from minidist.parallel.pipeline.schedule import bubble_fraction, one_f_one_b_schedule
from minidist.parallel.pipeline.zero_bubble import zero_bubble_schedule
from minidist.parallel.tensor.transformer_cost import korthikanti_bytes
from minidist.plan import Layout, ModelSpec, check_layout, enumerate_layouts, hardware, plan, predict_memory
from minidist.plan.predict import link_of, params_per_rank, predict_time
from minidist.sim.collective_cost import allreduce_cost

TINY = ModelSpec(layers=2, d_model=16, heads=4, seq=8, batch=8, vocab=11)


def test_plan_counts_equal_the_gpt_in_nn():
    gpt = GPT(11, 8, 2, 16, 4, rng=np.random.default_rng(0))
    assert TINY.total_params() == sum(p.data.size for p in gpt.parameters())
    assert TINY.flops_per_token() == gpt.flops_per_token(8)["total"]


def test_plan_activations_are_korthikantis():
    big = ModelSpec(layers=1, d_model=1024, heads=16, seq=2048, batch=1)
    for t in (1, 2, 8):
        paper = korthikanti_bytes(2048, 1, 1024, 16, t, True)
        assert big.activation_bytes(1, t, 1, "none", "eager") == pytest.approx(paper)
        flash = big.activation_bytes(1, t, 1, "none")                 # no s² scores, the FP32 log-sum-exp
        assert flash == pytest.approx((2048 * 1024 * 34 + 4 * 16 * 2048) / t)
    assert big.activation_bytes(1, 2, 1, "selective", "eager") == pytest.approx(2048 * 1024 * 34 / 2)
    assert big.activation_bytes(1, 2, 1, "full") == pytest.approx(2 * 2048 * 1024 / 2)
    assert big.activation_bytes(1, 1, 4, "selective", "eager") == pytest.approx(512 * 1024 * 34)  # s / c
    assert big.activation_bytes(1, 2, 1, "selective") == big.activation_bytes(1, 2, 1, "none")  # flash: same


def test_plan_memory_follows_zero():
    model = ModelSpec(layers=4, d_model=64, heads=4, seq=32, batch=16, vocab=100)
    psi = model.total_params()
    base = predict_memory(model, Layout(dp=4), "mixed")
    assert (base["parameters"], base["gradients"], base["optimizer"]) == (2 * psi, 2 * psi, 12 * psi)
    for stage, sharded in ((1, ("optimizer",)), (2, ("optimizer", "gradients")),
                           (3, ("optimizer", "gradients", "parameters"))):
        mem = predict_memory(model, Layout(dp=4, zero=stage), "mixed")
        for key in ("parameters", "gradients", "optimizer"):
            assert mem[key] == pytest.approx(base[key] / 4 if key in sharded else base[key])
    fp32 = predict_memory(model, Layout(dp=4), "fp32")
    assert (fp32["parameters"], fp32["optimizer"]) == (4 * psi, 8 * psi)
    assert fp32["activations"] == 2 * base["activations"]


def test_plan_memory_of_pipeline_tensor_and_experts():
    model = ModelSpec(layers=4, d_model=64, heads=4, seq=32, batch=16, vocab=100)
    dense, experts = params_per_rank(model, Layout(pp=2, tp=2, dp=2))
    first, last = model.outside_params()
    assert dense == (2 * model.dense_block_params() + max(first, last)) / 2 and experts == 0
    one = model.activation_bytes(1, 2, 1, "none")
    mem = predict_memory(model, Layout(pp=2, tp=2, dp=2))          # 1F1B: stage 0 holds min(M, P) = 2
    assert mem["activations"] == pytest.approx(2 * 2 * one)
    inter = predict_memory(model, Layout(pp=2, tp=2, dp=2, schedule="interleaved", chunks=2))
    assert inter["activations"] == pytest.approx(mem["activations"] * (1 + 1 / 4))
    chimera = predict_memory(model, Layout(pp=2, tp=2, dp=2, schedule="chimera"))
    assert chimera["parameters"] == 2 * mem["parameters"]          # two stages per rank
    moe = ModelSpec(layers=4, d_model=64, heads=4, seq=32, batch=16, vocab=100, experts=4, top_k=2)
    d1, e1 = params_per_rank(moe, Layout(dp=2))
    d4, e4 = params_per_rank(moe, Layout(ep=4))
    assert d1 == d4 and e4 == e1 / 4


def test_plan_bubbles_equal_the_schedule_tables():
    model = ModelSpec(layers=8, d_model=16, heads=2, seq=8, batch=8)      # M = 8 micro-batches of 1
    for schedule, table in (("1f1b", one_f_one_b_schedule(4, 8)),
                            ("interleaved", interleaved_schedule(4, 8, 2)),
                            ("zb-h1", zero_bubble_schedule(4, 8)), ("chimera", chimera_schedule(4, 8))):
        assert Layout(pp=4, schedule=schedule).bubble(model) == pytest.approx(bubble_fraction(table, 4))


def test_plan_time_uses_the_alpha_beta_model_per_level():
    model = ModelSpec(layers=2, d_model=64, heads=8, seq=16, batch=8, vocab=50)
    topo = Topology(nodes=2, per_node=4, intra=LinkModel(1e-6, 1e-11), inter=LinkModel(1e-5, 1e-10))
    hw = hardware("a100", 8, 4)
    hw = type(hw)(hw.memory, hw.machine, topo, "fp32")
    lay = Layout(dp=2, tp=4)
    assert link_of(lay, "tp", topo) == topo.intra and link_of(lay, "dp", topo) == topo.inter
    assert link_of(Layout(tp=8), "tp", topo) == topo.inter
    t = predict_time(model, lay, hw)
    dense, _ = params_per_rank(model, lay)
    assert t["dp"] == pytest.approx(allreduce_cost("ring", 2, int(4 * dense), 1e-5, 1e-10).time)
    act = 16 * 64 * 4                                                    # one sequence's activations, fp32
    assert t["tp"] == pytest.approx(4 * 2 * 4 * allreduce_cost("ring", 4, act, 1e-6, 1e-11).time)
    assert t["compute"] == pytest.approx(model.flops_per_token() * 8 * 16 / (8 * hw.machine.peak))
    assert t["total"] == pytest.approx(sum(v for k, v in t.items() if k != "total"))


def test_plan_layouts_and_reasons():
    layouts = enumerate_layouts(TINY, 8, zero=(0,), recompute=("none",))
    assert len(layouts) == 20                      # dp·pp·tp·cp = 2³: C(6, 3) ways
    assert all(lay.ep == 1 and lay.devices == 8 for lay in layouts)
    assert check_layout(TINY, Layout(tp=8)).startswith("does not divide: heads 4 % tp 8")
    assert "layers 2 % pp 4" in check_layout(TINY, Layout(pp=4, dp=2))
    assert "experts 0 % ep 2" in check_layout(TINY, Layout(ep=2))
    odd = Layout(pp=3, schedule="chimera")
    assert "Chimera needs an even pp" in check_layout(ModelSpec(3, 16, 4, 8, 9), odd)
    assert check_layout(TINY, Layout(dp=2, tp=2, cp=2)) is None
    with pytest.raises(ValueError, match="ZeRO stages"):
        enumerate_layouts(TINY, 8, zero=(4,))
    with pytest.raises(ValueError, match="schedule"):
        enumerate_layouts(TINY, 8, schedule="pipedream")
    with pytest.raises(ValueError, match="multiple of heads"):
        ModelSpec(2, 10, 4, 8, 8)
    with pytest.raises(ValueError, match="top_k"):
        ModelSpec(2, 16, 4, 8, 8, experts=2, top_k=3)


def test_plan_ranks_and_excludes_a_7b_model():
    model = ModelSpec(layers=32, d_model=4096, heads=32, seq=4096, batch=512)
    predictions = plan(model, hardware("h100", 64, 8))
    runnable = [p for p in predictions if p.excluded is None]
    times = [p.time["total"] for p in runnable]
    assert runnable and times == sorted(times)
    assert all(p.memory["total"] <= 80e9 for p in runnable)
    reasons = {p.excluded.split(":")[0] for p in predictions if p.excluded}
    assert reasons == {"does not divide", "does not fit"}
    alone = predict_memory(model, Layout(dp=64))                   # 16 bytes per parameter do not fit
    states = alone["parameters"] + alone["gradients"] + alone["optimizer"]
    assert states == pytest.approx(16 * model.total_params())


def test_plan_command_line(capsys):
    assert main(["plan", "--layers", "4", "--d-model", "64", "--heads", "4", "--seq", "16", "--batch", "8",
                 "--devices", "8", "--topology", "2x4", "--hardware", "v100", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "layout" in out and "excluded" in out and "does not divide" in out
    assert len([line for line in out.splitlines() if line.startswith(("dp", "pp", "tp", "cp"))]) >= 3
    for bad, message in ((["--heads", "5"], "multiple of heads"), (["--topology", "3x3"], "has 9 devices"),
                         (["--topology", "eight"], "NODESxPER_NODE"), (["--zero", "7"], "ZeRO stages")):
        argv = ["plan", "--layers", "4", "--d-model", "64", "--heads", "4", "--seq", "16", "--batch", "8",
                "--devices", "8", *bad]
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2 and message in capsys.readouterr().err
