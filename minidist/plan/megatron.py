"""Megatron-LM's Table 1 (published.py) priced by the planner: each row's layout, batch and cluster.

Assumed, as Megatron-LM ran in 2021 (Narayanan et al., "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM"): the a100-selene preset (nodes of 8 on NVSwitch, 25 GB/s of InfiniBand
per GPU); full activation recomputation (the count the table's FLOPs use); PyTorch eager with unfused
attention (``fused=False, attention="eager"``: FlashAttention came in 2022); the non-interleaved 1F1B
schedule and micro-batch 1 (the table gives neither; these are assumptions, not the paper's statement),
data parallel over the rest, ZeRO 0. Nothing here was tuned on the rows.

What it gives (planner / published TFLOP/s per GPU): 0.95 0.97 1.00 1.08 1.17 1.21 1.15 1.15 1.12 1.13 for
1.7B ... 1T: eight rows within 15%, 39.1B and 76.1B above (the planner is optimistic where a pipeline of
2-4 stages meets tensor parallelism of 8; the interleaved schedule would widen the gap by 2-4%).

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
    return model, Layout(dp=gpus // (t * p), pp=p, tp=t, recompute="full", schedule="1f1b", micro_batch=1)


def predicted_tflops(row: tuple) -> float:
    """The planner's TFLOP/s per GPU for a row, counted as the paper counts (with recomputation)."""
    model, layout = megatron_row(row)
    hw = hardware("a100-selene", layout.devices, 8, fused=False, attention="eager")
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
