"""``python -m minidist plan --explain``: where one rank's step time goes, op by op (roofline_ops.py).

One transformer block and the head for one micro-batch, forward and backward: each op's FLOPs, HBM bytes,
the roof that binds it (compute: the matmul rate; attention: FlashAttention's measured rate; memory: the
achieved bandwidth), its milliseconds and its FLOP/s; then the step's parts and how far its FLOP count at
the data sheet's peak is from the total; beside it, the memory per rank at the step's peak moment
(memory.py: what is held then, part by part).
"""

from __future__ import annotations

from .layouts import Layout
from .memory import peak_breakdown, predict_memory
from .model import ModelSpec
from .predict import Hardware, step_compute, step_ops
from .roofline_ops import Op


def op_row(op: Op) -> str:
    rate = f"{op.flops / op.seconds / 1e12:7.0f}" if op.flops and op.roof != "memory" else f"{'':>7}"
    return (f"  {op.name:<24}{op.flops / 1e9:>10.1f}{op.nbytes / 1e6:>10.1f}  {op.roof:<10}"
            f"{op.seconds * 1e3:>9.3f} {rate}")


def format_memory(model: ModelSpec, layout: Layout, hw: Hardware, memory: dict | None = None) -> str:
    """The memory held at the peak moment, part by part (memory: predict_memory's dict, else computed)."""
    memory = memory or predict_memory(model, layout, hw.precision, hw.attention, hw.weights)
    (moment, total), *parts = peak_breakdown(memory, hw.weights, hw.precision, layout.micro_batches(model))
    return (f"memory per rank at the peak, the {moment} ({hw.attention} attention, {hw.weights} weights): "
            f"{total / 1e9:.2f} GB = " + " + ".join(f"{name} {b / 1e9:.2f}" for name, b in parts if b))


def format_explain(model: ModelSpec, layout: Layout, hw: Hardware, memory: dict | None = None) -> str:
    """The breakdown of layout's step on hw's GPU (hw.gpu must be set), and its memory at the peak."""
    if hw.gpu is None or hw.precision != "mixed":
        raise ValueError("--explain prices ops on a GPU preset (--hardware) in mixed precision")
    ops, parts = step_ops(model, layout, hw), step_compute(model, layout, hw)
    kind = "fused (torch.compile)" if hw.fused else "eager"
    head = f"  {'op':<24}{'GFLOP':>10}{'MB':>10}  {'roof':<10}{'ms':>9} {'TFLOP/s':>7}"
    lines = [f"{hw.gpu.name}, {kind}, layout {layout.name()}, micro-batch {layout.micro_batch} "
             f"x {model.seq // layout.cp} tokens; one block, forward and backward:", head]
    lines += [op_row(op) for op in ops["layer"]]
    block = sum(op.seconds for op in ops["layer"])
    lines.append(f"  {'one block':<24}{'':>20}  {'':<10}{block * 1e3:>9.3f}   x {model.layers // layout.pp}"
                 f" blocks x {layout.micro_batches(model)} micro-batches")
    lines.append("the head, embeddings and optimizer:")
    lines += [op_row(op) for op in ops["head"] + ops["embeddings"] + ops["optimizer"]]
    lines.append("step compute: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in parts.items()))
    blocks = model.layers / layout.pp
    step_flops = layout.micro_batches(model) * (blocks * sum(op.flops for op in ops["layer"])
                                                + sum(op.flops for op in ops["head"]))
    at_peak = step_flops / hw.gpu.peak
    lines.append(f"its {step_flops / 1e12:.1f} TFLOP at the data sheet's {hw.gpu.peak / 1e12:.0f} TFLOP/s: "
                 f"{at_peak * 1e3:.2f} ms; predicted {parts['total'] / at_peak:.2f}x that")
    lines.append(format_memory(model, layout, hw, memory))
    return "\n".join(lines)
