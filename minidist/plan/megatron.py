"""Megatron-LM's Table 1 (published.py) priced by the planner: each row's layout, batch and cluster.

Assumed, as Megatron-LM ran in 2021 (Narayanan et al., "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM"): the a100-selene preset (nodes of 8 on NVSwitch, 25 GB/s of InfiniBand
per GPU); full activation recomputation (the count the table's FLOPs use); tensor parallelism without
sequence parallelism (it came with Korthikanti et al. 2022: each tensor rank runs the LayerNorms, dropouts
and residual adds on all its tokens); the paper's fused elementwise kernels (its section 4.2: bias+GeLU,
bias+dropout+add, fused LayerNorm and scale-mask-softmax: ``fused=True``) around unfused attention
(``attention="eager"``: the s² scores in HBM, FlashAttention came in 2022); the non-interleaved 1F1B
schedule and micro-batch 1 (the table gives neither; Table 2's PTD-P runs use micro-batch 1), data
parallel over the rest, ZeRO 0. Every cost is the planner's own (predict.py), none fitted to the rows.

What it gives (planner / published TFLOP/s per GPU), 1.7B ... 1T: 0.97 0.95 0.95 0.99 1.07 1.10 1.05 1.06
1.04 1.05, all within 15% (before the costs below: 0.95 0.97 1.00 1.08 1.17 1.21 1.15 1.15 1.12
1.13). The costs that closed the gap: the replicated regions without sequence parallelism (the t = 8 rows
lost ~8%), each micro-batch's gradients accumulated into the held ones (~2.5% on every row), the bubble
idling the micro-batches' tensor-parallel messages too. With eager elementwise kernels instead (PyTorch
without the paper's fusions) the rows read 0.89-1.03: within 15% as well. The interleaved schedule (v = 2)
raises the pipelined rows where it divides by 1-6% (39.1B 1.08, 145.6B 1.09, 310.1B 1.11, 1T 1.11).

    python -m minidist.plan.megatron      prints all ten rows: predicted and published TFLOP/s per GPU
"""

from __future__ import annotations

from .layouts import Layout
from .model import ModelSpec
from .predict import predict_time
from .presets import hardware
from .published import MEGATRON_TABLE1
from .throughput import narayanan_flops

SEQ, VOCAB = 2048, 51200


def megatron_row(row: tuple) -> tuple[ModelSpec, Layout]:
    """A Table 1 row's GPT and layout."""
    _, heads, hidden, layers, t, p, gpus, batch, _ = row
    model = ModelSpec(layers, hidden, heads, SEQ, batch, VOCAB)
    return model, Layout(dp=gpus // (t * p), pp=p, tp=t, recompute="full", schedule="1f1b", micro_batch=1,
                         sequence_parallel=False)


def predicted_tflops(row: tuple) -> float:
    """The planner's TFLOP/s per GPU for a row, counted as the paper counts (with recomputation)."""
    model, layout = megatron_row(row)
    hw = hardware("a100-selene", layout.devices, 8, fused=True, attention="eager")
    step = predict_time(model, layout, hw)["total"]
    return narayanan_flops(model, recompute=True) / (step * layout.devices) / 1e12


def format_table1() -> str:
    lines = [f"{'params':>8}{'t':>3}{'p':>4}{'GPUs':>6}{'batch':>6}{'published':>11}{'planner':>9}"
             f"{'ratio':>7}"]
    for row in MEGATRON_TABLE1:
        pred = predicted_tflops(row)
        lines.append(f"{row[0]:>7}B{row[4]:>3}{row[5]:>4}{row[6]:>6}{row[7]:>6}{row[8]:>11}{pred:>9.1f}"
                     f"{pred / row[8]:>7.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_table1())
