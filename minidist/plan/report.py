"""The planner's answer: every layout predicted, the ones that cannot run set aside with the reason, the
rest ranked by predicted step time; a table a user reads, and ``python -m minidist plan``.

    python -m minidist plan --layers 32 --d-model 4096 --heads 32 --seq 4096 --batch 512 \\
        --devices 64 --memory 80 --topology 8x8 --hardware h100
    python -m minidist plan --mode minidist --layers 2 --d-model 8 --heads 2 --seq 8 --batch 8 \\
        --vocab 11 --devices 8 --flops 1e9 --alpha 1e-6 --beta 2e-10 --measure
    (a Switch model: add --d-ff 16 --experts 2 --top-k 2; --zero1 shards AdamW over the data axis)

The second prices a small GPT on minidist's simulated cluster instead (minidist_plan.py says why the two
modes differ), the prediction the tests check against runs; ``--measure`` runs each layout beside it.
"""

from __future__ import annotations

import argparse
import json
import sys

from minidist.cluster import Device, LinkModel
from minidist.nn.checks import count_option
from minidist.parallel.pipeline.registry import PLANNED

from .explain import format_explain
from .layouts import Layout, check_layout, enumerate_layouts
from .memory import WEIGHTS, predict_memory
from .mode_options import check_plan_options, record_mode_defaults
from .model import ATTENTION, RECOMPUTE, ModelSpec
from .options import layout_option, memory_option, recompute_option, size_option, zero_option
from .predict import PRECISIONS, Hardware, Prediction, data_bytes, predict_time
from .presets import PRESETS, hardware
from .throughput import throughput
from .units import BYTES, SECONDS, format_bytes, unit  # noqa: F401  (format_bytes: the tables' and callers')

MODES_HELP = """Two modes. analytic (the default) prices a real GPU job: memory at the step's peak moment (16
bytes per parameter in mixed precision with Adam, FlashAttention's activations or --attention eager's, the
loss's logits; --weights), every op of a step on the GPU's achieved roofs
(matmuls with tile and wave quantization, FlashAttention-2's measured speed, the elementwise passes,
cross-entropy and AdamW by their bytes; --fused as torch.compile, --eager as PyTorch eager; --explain
shows them), the bubble's closed form, the alpha-beta model per link level (--hardware, --topology,
--memory). minidist prices a small GPT on minidist's simulated cluster (--flops, --alpha, --beta,
--memory): float64, the activations its layers keep, the task table walked on the clock, every
collective's rounds; the tests find it equal to the cluster's clock and memory ledger on every layout of
a tiny GPT on <= 8 ranks (--measure runs them)."""

def plan(model: ModelSpec, hw: Hardware, layouts: list[Layout] | None = None, **choices) -> list[Prediction]:
    """Every layout of hw's devices (choices: zero, recompute, schedule, chunks, micro_batch as in
    enumerate_layouts), or the ``layouts`` given, predicted; runnable ones first, fastest first; then the
    excluded, with reasons."""
    ranked, excluded = [], []
    for layout in layouts if layouts is not None else enumerate_layouts(model, hw.topology.size, **choices):
        reason = check_layout(model, layout)
        if reason:
            excluded.append(Prediction(layout, excluded=reason))
            continue
        memory = predict_memory(model, layout, hw.precision, hw.attention, hw.weights)
        p = Prediction(layout, memory, predict_time(model, layout, hw))
        if p.memory["total"] > hw.memory:
            p.excluded = f"does not fit: {format_bytes(p.memory['total'])} > {format_bytes(hw.memory)}"
            excluded.append(p)
        else:
            ranked.append(p)
    ranked.sort(key=lambda p: (p.time["total"], p.memory["total"]))
    excluded.sort(key=lambda p: (p.excluded.split(":")[0], p.memory.get("total", 0)))
    return ranked + excluded


LEGEND = """M: micro-batches per step on one pipeline (batch / (dp·ep·micro-batch)). Memory: bytes per rank
at the step's peak moment (total: the loss's or the optimizer's, the larger), params/grads/optim the states,
activ the activations and the loss's logits held then. comm: the communication's exposed seconds (only
ZeRO-3's gathers overlap compute; the rest is counted whole). tok/s and TFLOP/s per GPU: Narayanan's model
FLOPs without recomputation's extra pass (72·B·s·l·h²(...), throughput.py); MFU: that over the data sheet's
peak."""


def metrics(model: ModelSpec, p: Prediction, hw: Hardware) -> dict[str, float]:
    """The table's and --json's figures of one priced prediction."""
    return {"step_s": p.time["total"], "memory_gb": p.memory["total"] / 1e9,
            **throughput(model, p.time["total"], p.layout.devices, hw.machine.peak),
            "data_bytes_per_rank": data_bytes(model, p.layout, hw.precision)}


def format_plan(model: ModelSpec, predictions: list[Prediction], top: int = 10,
                hw: Hardware | None = None) -> str:
    """The table: the best ``top`` layouts (with hw: tokens/s, TFLOP/s per GPU and MFU too), a legend, then
    how many were excluded and a few reasons of each kind."""
    runnable = [p for p in predictions if p.excluded is None]
    mem_unit, mem_size = unit(max((p.memory["total"] for p in runnable[:top]), default=1e9), BYTES)
    time_unit, time_size = unit(max((p.time["total"] for p in runnable[:top]), default=1.0), SECONDS)
    head = (f"{'layout':<22}{'ZeRO':>5} {'recompute':<10}{'M':>5}{'params':>9}{'grads':>8}{'optim':>8}"
            f"{'activ':>8}{'total ' + mem_unit:>10}{'compute':>9}{'bubble':>8}{'comm':>8}"
            f"{'step ' + time_unit:>9}" + (f"{'tok/s/GPU':>11}{'TFLOP/s':>9}{'MFU':>6}" if hw else ""))
    experts = f", {model.experts} experts top-{model.top_k}" if model.moe else ""
    lines = [f"model: {model.total_params():,} parameters, {model.layers} layers, d={model.d_model}, "
             f"{model.heads} heads, T={model.seq}, batch {model.batch}" + experts,
             head, "-" * len(head)]
    for p in runnable[:top]:
        m, t, lay = p.memory, p.time, p.layout
        comm = t["total"] - t["compute"] - t["bubble"]
        held = m["activations"] + m["logits"] if m["loss moment"] >= m["optimizer moment"] else 0.0
        row = (f"{lay.name():<22}{lay.zero:>5} {lay.recompute:<10}{lay.micro_batches(model):>5}"
               + "".join(f"{v / mem_size:>{w}.2f}" for v, w in ((m["parameters"], 9), (m["gradients"], 8),
                                                                (m["optimizer"], 8), (held, 8),
                                                                (m["total"], 10)))
               + "".join(f"{v / time_size:>{w}.3f}" for v, w in ((t["compute"], 9), (t["bubble"], 8),
                                                                 (comm, 8), (t["total"], 9))))
        if hw:
            fig = metrics(model, p, hw)
            row += f"{fig['tokens_per_s_per_gpu']:>11,.0f}{fig['tflops_per_gpu']:>9.1f}{fig['mfu']:>6.1%}"
        lines.append(row)
    if not runnable:
        lines.append("no layout runs: every one is excluded (see below)")
    lines.append(LEGEND)
    out = [p for p in predictions if p.excluded]
    lines.append(f"\n{len(runnable)} layouts run, {len(out)} excluded; for example:")
    for kind in ("does not divide", "refused", "does not fit"):
        for p in [p for p in out if p.excluded.startswith(kind)][:3]:
            lay = p.layout
            lines.append(f"  {lay.name():<22} ZeRO {lay.zero} {lay.recompute:<10} {p.excluded}")
    return "\n".join(lines)


def format_json(model: ModelSpec, predictions: list[Prediction], hw: Hardware, top: int) -> str:
    """One JSON object a line per layout: the best ``top`` runnable ones, then every excluded one (with
    "excluded": why, and its figures null when it was not priced)."""
    rows = []
    runnable = [p for p in predictions if p.excluded is None][:top]
    for p in runnable + [p for p in predictions if p.excluded]:
        lay = p.layout
        row = {"layout": lay.name(), "dp": lay.dp, "ep": lay.ep, "pp": lay.pp, "tp": lay.tp, "cp": lay.cp,
               "zero": lay.zero, "recompute": lay.recompute, "schedule": lay.schedule,
               "micro_batch": lay.micro_batch, "excluded": p.excluded}
        figures = metrics(model, p, hw) if p.time else dict.fromkeys(
            ("step_s", "memory_gb", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"))
        rows.append(json.dumps({**row, **figures}))
    return "\n".join(rows)


SIZES = (("layers", None, "transformer blocks L"), ("d-model", None, "model width d"),
         ("heads", None, "attention heads a (d_model a multiple of it)"),
         ("seq", None, "tokens per sequence T"), ("batch", None, "sequences per step, global B"),
         ("devices", None, "devices D the layouts split the job over"),
         ("vocab", 32000, "vocabulary V (default 32000)"), ("d-ff", None, "MLP width (default 4·d_model)"),
         ("top-k", 1, "experts per token (default 1)"),
         ("micro-batch", 1, "sequences per micro-batch (default 1)"),
         ("chunks", 2, "model chunks per rank under --schedule interleaved (default 2)"))


def add_parser(sub) -> None:
    """The ``plan`` command of python -m minidist."""
    p = sub.add_parser("plan", help="predict memory and step time of every parallel layout, ranked",
                       description=MODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default, text in SIZES:
        p.add_argument(f"--{name}", type=size_option(1), default=default, help=text,
                       required=default is None and name != "d-ff")
    p.add_argument("--experts", type=size_option(0), default=0,
                   help="experts per MoE layer (default 0: dense)")
    p.add_argument("--top", type=count_option(1), default=10, help="rows of the table (default 10)")
    p.add_argument("--memory", type=memory_option, default=None,
                   help="memory per device: 80 (GB), 80GB or 80GiB (default: the hardware's)")
    p.add_argument("--topology", default=None, help="NODESxPER_NODE, e.g. 8x8 (default: nodes of 8)")
    p.add_argument("--hardware", default="h100", choices=tuple(PRESETS), help="the device (default h100)")
    p.add_argument("--precision", default="mixed", choices=tuple(PRECISIONS),
                   help="mixed (16-bit compute, FP32 master weights and Adam) or fp32 (default mixed)")
    p.add_argument("--schedule", default="1f1b", choices=PLANNED, help="pipeline schedule (default 1f1b)")
    p.add_argument("--zero", type=zero_option, default=(0, 1), help="ZeRO stages to consider, e.g. 0,1,2,3")
    p.add_argument("--recompute", type=recompute_option, default=RECOMPUTE,
                   help=f"recomputation to consider, among {','.join(RECOMPUTE)} (default all three)")
    p.add_argument("--layout", type=layout_option, default=None,
                   help="analytic mode: price this one layout, e.g. dp=32,pp=2,tp=2 (also cp=, ep=, zero=, "
                        "recompute=, schedule=, chunks=, micro-batch=; the sizes' product is --devices)")
    p.add_argument("--json", action="store_true",
                   help="analytic mode: one JSON object a line per layout (layout, step_s, memory_gb, "
                        "tokens_per_s_per_gpu, tflops_per_gpu, mfu, ...) instead of the table")
    p.add_argument("--attention", default="flash", choices=ATTENTION,
                   help="analytic mode: flash (FlashAttention: no s x s scores kept, the default) or eager "
                        "(the scores materialized, as without FlashAttention)")
    p.add_argument("--weights", default="bf16", choices=WEIGHTS,
                   help="analytic mode: bf16 (16-bit weights beside FP32 masters, cast once a step; default) "
                        "or autocast (FP32 parameters cast at every micro-batch, PyTorch autocast)")
    kernels = p.add_mutually_exclusive_group()
    kernels.add_argument("--fused", dest="fused", action="store_true", default=True,
                         help="analytic mode: price torch.compile's fused kernels (the default)")
    kernels.add_argument("--eager", dest="fused", action="store_false",
                         help="analytic mode: price PyTorch eager's one kernel per operation")
    p.add_argument("--explain", action="store_true",
                   help="analytic mode: print the best layout's ops (FLOPs, bytes, binding roof, ms)")
    p.add_argument("--mode", default="analytic", choices=("analytic", "minidist"),
                   help="analytic: a GPU job (--hardware, --topology, ...); minidist: the simulated cluster")
    p.add_argument("--flops", type=float, default=Device.flops, help="minidist mode: FLOP/s per rank")
    p.add_argument("--alpha", type=float, default=LinkModel.alpha, help="minidist mode: seconds per message")
    p.add_argument("--beta", type=float, default=LinkModel.beta, help="minidist mode: seconds per byte")
    p.add_argument("--measure", action="store_true", help="minidist mode: run each layout one step too")
    p.add_argument("--zero1", action="store_true", help="minidist mode: ZeRO-1 over the data axis (D > 1)")
    p.set_defaults(func=cmd_plan)
    record_mode_defaults(p)


def parse_topology(text: str | None, devices: int) -> int:
    """'NODESxPER_NODE' -> per_node (checking NODES · PER_NODE = devices); None: nodes of min(8, devices)."""
    if text is None:
        return min(8, devices) if devices % min(8, devices) == 0 else devices
    try:
        nodes, per_node = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--topology expects NODESxPER_NODE such as 8x8, got {text!r}") from None
    if nodes * per_node != devices:
        raise ValueError(f"--topology {text} has {nodes * per_node} devices, --devices says {devices}")
    return per_node


def check_devices(model: ModelSpec, devices: int, micro_batch: int) -> None:
    """ValueError unless some layout could use ``devices``: data × expert ranks split the batch into
    micro-batches (at most batch / micro_batch), pipeline ranks the layers, tensor × context ranks the
    tokens of a sequence; more devices than (batch / micro_batch) · layers · seq leave every layout
    undivided (and the enumeration would be needlessly long)."""
    largest = max(1, model.batch // micro_batch) * model.layers * model.seq
    if devices > largest:
        raise ValueError(f"--devices {devices}: no layout uses more than (batch / micro-batch) · layers "
                         f"· seq = {largest} devices")


def given_layout(args) -> Layout:
    """--layout's Layout (defaults: --schedule, --chunks, --micro-batch; ZeRO 0, no recomputation), its
    sizes' product checked against --devices."""
    fields = {"schedule": args.schedule, "chunks": args.chunks, "micro_batch": args.micro_batch,
              **args.layout}
    layout = Layout(**fields)
    if layout.devices != args.devices:
        raise ValueError(f"--layout uses dp·ep·pp·tp·cp = {layout.devices} devices, --devices says "
                         f"{args.devices}")
    return layout


def cmd_plan(args) -> int:
    try:
        check_plan_options(args)
        model = ModelSpec(args.layers, args.d_model, args.heads, args.seq, args.batch, args.vocab, args.d_ff,
                          args.experts, args.top_k)
        check_devices(model, args.devices, args.micro_batch)
        if args.mode == "minidist":
            return cmd_plan_minidist(model, args)
        per_node = parse_topology(args.topology, args.devices)
        hw = hardware(args.hardware, args.devices, per_node, args.memory, args.precision, args.fused,
                      args.attention, args.weights)
        layouts = None if args.layout is None else [given_layout(args)]
        predictions = plan(model, hw, layouts, zero=args.zero, recompute=args.recompute,
                           schedule=args.schedule, chunks=args.chunks, micro_batch=args.micro_batch)
        best = next((p for p in predictions if p.excluded is None), None)
        if args.explain and args.layout is not None and best is None:
            best = predictions[0] if predictions[0].time else None      # explain a layout that does not fit
        explained = format_explain(model, best.layout, hw, best.memory) if args.explain and best else None
    except ValueError as error:       # argparse's convention: one line naming the problem, exit status 2
        print(f"python -m minidist plan: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.json:
        print(format_json(model, predictions, hw, args.top))
        return 0
    print(format_plan(model, predictions, args.top, hw))
    if explained:
        print("\n" + explained)
    return 0


def cmd_plan_minidist(model: ModelSpec, args) -> int:
    """``--mode minidist``: the table of minidist_plan.py (ValueError on bad input, as cmd_plan)."""
    from .minidist_plan import format_minidist_plan, plan_minidist  # the minidist mode, on demand

    memory = Device.memory if args.memory is None else int(args.memory)
    device, link = Device(flops=args.flops, memory=memory), LinkModel(alpha=args.alpha, beta=args.beta)
    if model.moe and model.top_k != model.experts:
        raise ValueError("minidist mode prices a Switch model whose routing is known without running: "
                         "--top-k must equal --experts (every token to every expert)")
    if not model.moe and model.ff != 4 * model.d_model:
        raise ValueError("minidist mode trains nn.GPT: a dense model with d_ff = 4·d_model")
    plans = plan_minidist(model, args.devices, device, link, measured=args.measure, zero1=args.zero1)
    print(format_minidist_plan(model, plans, device, link, args.top))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minidist plan")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *(argv or [])])
    return args.func(args)
