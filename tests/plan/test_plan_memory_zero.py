"""The planner's memory at the peak moment (plan/memory.py) against an H100, ZeRO's volumes as the paper's,
the casts as the modelled run does them (issue 54; Megatron-LM's Table 1: test_plan_megatron_costs.py).

Measured (issue 54): one H100 80GB, PyTorch 2.11, bf16 autocast, scaled_dot_product_attention(is_causal=True)
(FlashAttention), fused AdamW, FP32 parameters, learned positions, GELU MLP of 4d, untied head, one
micro-batch; torch.cuda.max_memory_allocated over 10 steps after 3 warm-ups."""

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.__main__ import main
from minidist.cluster import run
from minidist.nn import GPT, CrossEntropyLoss
from minidist.optim import Adam
from minidist.parallel.data.zero import ZeRO
from minidist.plan import Layout, ModelSpec, hardware, plan, predict_memory
from minidist.plan.layouts import check_layout
from minidist.plan.predict import data_bytes, step_ops

# (layers, d_model, heads, seq, batch, vocab): peak GB measured
MEASURED_PEAK_GB = {(12, 768, 12, 1024, 16, 50304): 16.05, (24, 1024, 16, 1024, 8, 50304): 17.09}


def plan_json(argv, capsys) -> list[dict]:
    assert main(["plan", *argv, "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("shape", list(MEASURED_PEAK_GB))
def test_peak_memory_within_10_percent_of_the_h100(shape, capsys):
    L, d, a, T, B, V = shape
    argv = ["--layers", str(L), "--d-model", str(d), "--heads", str(a), "--seq", str(T), "--batch", str(B),
            "--vocab", str(V), "--hardware", "h100", "--devices", "1", "--micro-batch", str(B)]
    rows = plan_json(argv, capsys)
    default = next(r for r in rows if r["layout"] == "single" and r["zero"] == 0 and r["recompute"] == "none")
    assert default["memory_gb"] == pytest.approx(MEASURED_PEAK_GB[shape], rel=0.10)
    model = ModelSpec(*shape)
    autocast = predict_memory(model, Layout(micro_batch=B), weights="autocast")    # the measured framework
    assert autocast["total"] / 1e9 == pytest.approx(MEASURED_PEAK_GB[shape], rel=0.10)


def test_peak_is_the_largest_moment_and_flash_keeps_no_scores():
    model = ModelSpec(12, 768, 12, 1024, 16, 50304)
    lay = Layout(micro_batch=16)
    flash, eager = predict_memory(model, lay), predict_memory(model, lay, attention="eager")
    assert flash["total"] == max(flash["loss moment"], flash["optimizer moment"])
    held = ("parameters", "gradients", "optimizer", "weight copies", "activations", "logits")
    assert flash["loss moment"] == pytest.approx(sum(flash[k] for k in held))
    scores = 5 * 12 * 1024 * 1024 * 16 - 4 * 12 * 1024 * 16         # Korthikanti's 5as²b less the lse
    assert eager["activations"] - flash["activations"] == pytest.approx(12 * scores)
    logits = 16 * 1024 * 50304
    assert flash["logits"] == 10 * logits                           # bf16 logits, FP32 copy, log-probs
    assert flash["optimizer moment"] == pytest.approx(16 * model.total_params())


@given(dp=st.integers(2, 8), tp=st.sampled_from([1, 2, 4]), stage=st.sampled_from([1, 2]))
def test_zero3_sends_1_5_times_zero1_and_stages_1_2_the_all_reduce(dp, tp, stage):
    model = ModelSpec(layers=4, d_model=64, heads=4, seq=32, batch=16, vocab=100)
    plain, zero = (data_bytes(model, Layout(dp=dp, tp=tp, zero=z)) for z in (0, stage))
    assert zero == plain == pytest.approx(2 * (dp - 1) / dp * 2 * (model.total_params() / tp))
    assert data_bytes(model, Layout(dp=dp, tp=tp, zero=3)) == pytest.approx(1.5 * zero)


def zero_step_bytes(comm, stage: int) -> int:
    """Bytes this rank sends in one step of minidist's ZeRO (float32) on a tiny GPT."""
    gpt = GPT(12, 8, 2, 16, 4, rng=np.random.default_rng(0))
    zero = ZeRO(comm, gpt, lambda shards: Adam(shards), CrossEntropyLoss(), stage=stage)
    rng = np.random.default_rng(1)
    before = comm.stats.bytes_sent
    zero.train_step(rng.integers(0, 12, size=(4, 8)), rng.integers(0, 12, size=(4, 8)))
    return comm.stats.bytes_sent - before


@pytest.mark.parametrize("ranks", [2, 4])
def test_zero_bytes_equal_the_simulated_clusters_for_every_stage(ranks):
    spec = ModelSpec(layers=2, d_model=16, heads=4, seq=8, batch=8, vocab=12)
    for stage in (1, 2, 3):
        sent = run(zero_step_bytes, ranks, stage)
        assert sent == [data_bytes(spec, Layout(dp=ranks, zero=stage), "fp32")] * ranks, stage


def test_zero3_costs_more_than_zero1_unless_its_gathers_hide_and_pipelines_are_refused():
    model = ModelSpec(layers=32, d_model=4096, heads=32, seq=4096, batch=512)
    hw = hardware("h100", 64, 8)
    times = {p.layout.zero: p.time["dp"] for p in plan(model, hw, [Layout(dp=64, zero=z) for z in (1, 2, 3)])}
    assert times[1] == times[2] <= times[3]
    for z in (2, 3):
        assert check_layout(model, Layout(dp=32, pp=2, zero=z)).startswith("refused by parallelize")
    assert check_layout(model, Layout(dp=32, pp=2, zero=1)) is None


def test_casts_once_per_step_with_16_bit_weights_per_micro_batch_under_autocast():
    model = ModelSpec(layers=4, d_model=256, heads=4, seq=64, batch=32)
    casts = {}
    for weights in ("bf16", "autocast"):
        for micro in (1, 8):
            ops = step_ops(model, Layout(micro_batch=micro), hardware("h100", 1, 1, weights=weights))
            casts[weights, micro] = next(op.nbytes for op in ops["optimizer"] if op.name == "weight casts")
    assert casts["bf16", 1] == casts["bf16", 8] == 6 * model.total_params()
    assert casts["autocast", 1] == 8 * casts["autocast", 8] == 12 * 32 * model.total_params()


def test_recomputation_all_three_tried_each_with_its_memory_and_flops():
    model = ModelSpec(layers=8, d_model=512, heads=8, seq=1024, batch=8)
    by = {p.layout.recompute: p for p in plan(model, hardware("h100", 1, 1, attention="eager"))}
    assert set(by) == {"none", "selective", "full"}
    memory = [by[r].memory["activations"] for r in ("none", "selective", "full")]
    compute = [by[r].time["compute"] for r in ("none", "selective", "full")]
    assert memory == sorted(memory, reverse=True) and compute == sorted(compute)


def test_layout_option_prices_one_layout_and_json_has_the_figures(capsys):
    argv = ["--layers", "8", "--d-model", "512", "--heads", "8", "--seq", "512", "--batch", "64",
            "--devices", "8", "--layout", "dp=2,pp=2,tp=2,zero=1,recompute=full,micro-batch=2"]
    rows = plan_json(argv, capsys)
    assert len(rows) == 1 and rows[0]["layout"] == "dp2 pp2 tp2" and rows[0]["micro_batch"] == 2
    for key in ("layout", "step_s", "memory_gb", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"):
        assert rows[0][key] is not None
    assert rows[0]["tokens_per_s_per_gpu"] == pytest.approx(64 * 512 / (8 * rows[0]["step_s"]))
    assert main(["plan", *argv]) == 0
    table = capsys.readouterr().out
    assert "MFU" in table and "M: micro-batches" in table and "exposed" in table


@pytest.mark.parametrize("value", ["dp=3", "dp=2,pp=x", "zero=4,dp=8", "recompute=some,dp=8", "size=8",
                                   "schedule=gpipe2,dp=8", "dp"])
def test_bad_layout_is_one_line_exit_2(value, capsys):
    argv = ["plan", "--layers", "8", "--d-model", "512", "--heads", "8", "--seq", "512", "--batch", "64",
            "--devices", "8", "--layout", value]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) >= 1 and "error:" in err[-1] and "--layout" in err[-1]

