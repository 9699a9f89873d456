"""The analytic planner's GPU step (plan/roofline_ops.py, plan/gpus.py): each op priced on the achieved roofs,
the step checked against steps measured on an H100, and Llama 2's published throughput.

Measured (minidist issue 44, 2026-11-27): one H100 80GB HBM3, PyTorch 2.11, bf16 autocast,
scaled_dot_product_attention(is_causal=True), fused AdamW, learned position embeddings, GELU MLP of 4d,
untied head, one micro-batch, mean of 10 steps after 3 warm-ups (benchmarks/planner_gpu.md). Nothing in
the model was fitted to these steps: its constants are the data sheet, the measured 8192³ matmul and copy,
FlashAttention-2's published speeds and the counts of bytes each kernel moves."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.plan import Layout, ModelSpec, hardware, plan
from minidist.plan.gpus import GPUS
from minidist.plan.predict import predict_time, step_compute, step_ops
from minidist.plan.published import RUNS
from minidist.plan.roofline_ops import mainloop, matmul

# (layers, d_model, heads, seq, batch, vocab): (eager ms, torch.compile ms) measured, issue 44
MEASURED = {(12, 768, 12, 1024, 16, 50304): (51.22, 42.19),
            (24, 1024, 16, 1024, 8, 50304): (64.96, 53.72)}
LLAMA7 = ModelSpec(layers=32, d_model=4096, heads=32, seq=4096, batch=1024, vocab=32000, d_ff=11008 * 3 // 2)
LLAMA70 = ModelSpec(layers=80, d_model=8192, heads=64, seq=4096, batch=1024, vocab=32000, d_ff=28672 * 3 // 2)


def one_gpu_ms(shape, fused: bool) -> float:
    model = ModelSpec(*shape)
    hw = hardware("h100", 1, 1, fused=fused, weights="autocast")     # the measured run: FP32 parameters
    return 1e3 * predict_time(model, Layout(micro_batch=model.batch), hw)["total"]


@pytest.mark.parametrize("shape", list(MEASURED))
def test_gpu_step_matches_the_measured_h100_steps(shape):
    eager, compiled = MEASURED[shape]
    assert one_gpu_ms(shape, fused=True) == pytest.approx(compiled, rel=0.15)
    assert one_gpu_ms(shape, fused=False) == pytest.approx(eager, rel=0.20)
    assert one_gpu_ms(shape, True) < one_gpu_ms(shape, False)            # fusion only removes passes


def test_matmul_model_gives_the_measured_8192_cube_and_quantizes():
    h100 = GPUS["h100"]
    big = matmul(h100, "8192³", 8192, 8192, 8192)
    assert big.flops / big.seconds == pytest.approx(791e12, rel=0.01) and big.roof == "compute"
    aligned, ragged = matmul(h100, "a", 16384, 2048, 1024), matmul(h100, "b", 16384, 2049, 1024)
    assert ragged.seconds > aligned.seconds * 1.03          # one more column costs a column of tiles
    thin = matmul(h100, "matrix-vector", 8192, 1, 8192)      # one column: the operand stream binds
    assert thin.roof == "memory"
    for m, n, k in ((16384, 2304, 768), (768, 3072, 16384), (16384, 50304, 768)):
        op = matmul(h100, "x", m, n, k)
        assert op.flops / op.seconds < h100.matmul                        # never above what was measured


def test_each_op_is_bound_by_a_plausible_roof():
    model = ModelSpec(12, 768, 12, 1024, 16, 50304)
    ops = step_ops(model, Layout(micro_batch=16), hardware("h100", 1, 1))
    for op in ops["layer"] + ops["head"]:
        first, last = op.name.split()[0], op.name.split()[-1]
        if first in ("qkv", "proj", "fc1", "fc2", "logits") and last in ("fwd", "dX", "dW"):
            assert op.roof == "compute", op
        elif op.name.startswith("attention"):
            assert op.roof == "attention", op
        else:
            assert op.roof == "memory" and op.flops <= 5 * op.nbytes, op
    assert {op.roof for op in ops["optimizer"]} == {"memory"}


def test_step_scales_as_its_parts():
    """Twice the layers: twice the blocks' time; twice the vocabulary: the head's time grows about twice;
    a longer sequence at the same tokens: attention grows, the rest does not."""
    hw = hardware("h100", 1, 1)
    base = ModelSpec(12, 768, 12, 1024, 16, 50304)
    lay = Layout(micro_batch=16)
    parts = step_compute(base, lay, hw)
    deeper = step_compute(ModelSpec(24, 768, 12, 1024, 16, 50304), lay, hw)
    assert deeper["layers"] == pytest.approx(2 * parts["layers"])
    wider_vocab = step_compute(ModelSpec(12, 768, 12, 1024, 16, 100608), lay, hw)
    assert 1.8 < wider_vocab["head and embeddings"] / parts["head and embeddings"] < 2.1
    longer = step_ops(ModelSpec(12, 768, 12, 4096, 4, 50304), Layout(micro_batch=4), hw)["layer"]
    short = step_ops(base, lay, hw)["layer"]
    attention = [sum(op.flops for op in ops if op.name.startswith("attention")) for ops in (short, longer)]
    assert attention[1] == pytest.approx(4 * attention[0])
    others = [sum(op.seconds for op in ops if not op.name.startswith("attention")) for ops in (short, longer)]
    assert others[1] == pytest.approx(others[0], rel=0.05)


@pytest.mark.parametrize("label, model", [("7b", LLAMA7), ("70b", LLAMA70)])
def test_llama2_throughput_within_30_percent_of_published(label, model):
    """Llama 2's tokens per GPU-second (2.0T tokens / GPU hours on A100-80GB, published.py) beside the
    planner's best layout on 1024 A100s: the GPU count is not published; LLaMA-65B (Touvron et al. 2023,
    "LLaMA: Open and Efficient Foundation Language Models") trained on 2048."""
    best = next(p for p in plan(model, hardware("a100", 1024, 8), zero=(0, 1),
                                recompute=("none", "selective", "full")) if p.excluded is None)
    tokens = model.batch * model.seq / (1024 * best.time["total"])
    assert tokens == pytest.approx(RUNS[f"llama2-{label}"].derived_tokens_per_gpu_second(), rel=0.30)


def test_llama_65b_on_2048_gpus_within_30_percent_of_published():
    """A run the model was not tuned on, with its GPU count published: LLaMA 65B (80 layers, d = 8192, 64
    heads, SwiGLU 22016: d_ff 1.5 × that), 2048-token context, 4M-token batches, 380 tokens/s per GPU on
    2048 A100-80GB."""
    run = RUNS["llama-65b"]
    model = ModelSpec(layers=80, d_model=8192, heads=64, seq=run.seq, batch=run.batch_sequences, vocab=32000,
                      d_ff=22016 * 3 // 2)
    predictions = plan(model, hardware("a100", run.gpus, 8), zero=(1,), recompute=("none", "selective"))
    best = next(p for p in predictions if p.excluded is None)
    tokens = model.batch * model.seq / (run.gpus * best.time["total"])
    assert tokens == pytest.approx(run.derived_tokens_per_gpu_second(), rel=0.30)


@given(m=st.integers(1, 40000), n=st.integers(1, 40000), k=st.integers(1, 40000),
       gpu=st.sampled_from(sorted(GPUS)))
def test_a_matmul_never_beats_its_roofs(m, n, k, gpu):
    """Whatever the shape, a matmul takes at least its FLOPs at the math rate and its bytes at the achieved
    bandwidth: quantization and the store only add."""
    device = GPUS[gpu]
    op = matmul(device, "x", m, n, k)
    assert op.seconds >= op.flops / mainloop(device) and op.seconds >= op.nbytes / device.copy
    assert mainloop(device) < device.peak


@given(layers=st.integers(1, 8), heads=st.sampled_from([1, 4, 12]), head_dim=st.sampled_from([32, 64, 128]),
       seq=st.sampled_from([128, 1024, 4096]), batch=st.integers(1, 8), vocab=st.integers(100, 60000))
def test_a_step_is_slower_than_its_flops_at_peak_and_eager_slower_than_fused(layers, heads, head_dim, seq,
                                                                             batch, vocab):
    model = ModelSpec(layers, heads * head_dim, heads, seq, batch, vocab)
    lay = Layout(micro_batch=batch)
    fused, eager = (step_compute(model, lay, hardware("h100", 1, 1, fused=f))["total"] for f in (True, False))
    ops = step_ops(model, lay, hardware("h100", 1, 1))
    flops = layers * sum(op.flops for op in ops["layer"]) + sum(op.flops for op in ops["head"])
    assert flops / GPUS["h100"].peak < fused < eager
