"""Where one training step's time goes, layer by layer: minidist's forward and backward per layer kind,
beside torch.profiler's operators on the same shapes (the three models of train_step.py and
transformer_step.py), one thread.

    PYTHONPATH=. python benchmarks/step_profile.py [--steps 10] [--models mlp,cnn,gpt]

minidist: every module's forward and backward is timed with perf_counter (its own time: a module's
children are subtracted), summed over ``steps`` steps after two warm-up steps, and grouped by the
module's class. torch: torch.profiler's self CPU time per operator, the products (mm, addmm, bmm,
convolution) apart from the rest. Times are ms per step.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ[_var] = "1"  # must happen before NumPy loads its BLAS

import argparse
import collections
import time

import numpy as np
import train_step
import transformer_step as gpt_bench

from minidist import nn
from minidist.optim import AdamW

PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::convolution_backward", "aten::mkldnn_convolution",
            "aten::_slow_conv2d_forward", "aten::_slow_conv2d_backward", "aten::thnn_conv2d")


def time_modules(model, step, steps: int) -> dict[str, float]:
    """ms per step of each module class's own forward and backward time ("Linear.backward": ...)."""
    totals: dict[str, float] = collections.defaultdict(float)
    stack: list[float] = []  # time spent in children of the calls now open

    def wrap(module, name: str):
        method = getattr(module, name)
        key = f"{type(module).__name__}.{name}"

        def timed(*args, **kwargs):
            stack.append(0.0)
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                totals[key] += elapsed - stack.pop()
                if stack:
                    stack[-1] += elapsed
        setattr(module, name, timed)

    for module in model.modules():
        wrap(module, "forward")
        wrap(module, "backward")
    step()
    step()
    totals.clear()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    whole = (time.perf_counter() - start) / steps * 1e3
    per_step = {key: value / steps * 1e3 for key, value in totals.items()}
    per_step["(loss, optimizer, loop)"] = whole - sum(per_step.values())
    per_step["step"] = whole
    return per_step


def torch_profile(torch, step, steps: int) -> dict[str, float]:
    """ms per step of torch's operators, self CPU time."""
    step()
    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}


def minidist_cases(rng):
    mlp_x = rng.standard_normal((256, 1024)).astype(np.float32)
    cnn_x = rng.standard_normal((64, 1, 28, 28)).astype(np.float32)
    mlp, cnn = train_step.minidist_mlp(rng), train_step.minidist_cnn(rng)
    mlp_y, cnn_y = rng.integers(0, 10, 256), rng.integers(0, 10, 64)
    tokens = rng.integers(0, gpt_bench.VOCAB, (gpt_bench.B, gpt_bench.T + 1))
    gpt = nn.GPT(gpt_bench.VOCAB, gpt_bench.T, gpt_bench.LAYERS, gpt_bench.D, gpt_bench.HEADS, rng=rng)
    opt, loss_fn = AdamW(gpt.parameters(), lr=1e-3), nn.CrossEntropyLoss()

    def gpt_step():
        opt.zero_grad()
        loss_fn(gpt.forward(tokens[:, :-1]), tokens[:, 1:])
        gpt.backward(loss_fn.backward())
        opt.step()
    return {"mlp": (mlp, train_step.runner_step(mlp, mlp_x, mlp_y), (mlp_x, mlp_y)),
            "cnn": (cnn, train_step.runner_step(cnn, cnn_x, cnn_y), (cnn_x, cnn_y)),
            "gpt": (gpt, gpt_step, tokens)}


def torch_steps(torch, data):
    torch_mlp, torch_cnn = train_step.torch_models(torch)
    steps = {name: train_step.torch_step(torch, model, *data[name], input_grad=False)
             for name, model in (("mlp", torch_mlp), ("cnn", torch_cnn))}
    ref = gpt_bench.torch_gpt(torch, sdpa=False)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    tin = torch.from_numpy(data["gpt"][:, :-1])
    tout = torch.from_numpy(data["gpt"][:, 1:]).reshape(-1)

    def gpt_step():
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(tin).reshape(-1, gpt_bench.VOCAB), tout).backward()
        ref_opt.step()
    steps["gpt"] = gpt_step
    return steps


def print_table(title: str, rows: dict[str, float], top: int) -> None:
    print(f"\n| {title} | ms/step |\n|---|---:|")
    for key, value in sorted(rows.items(), key=lambda kv: -kv[1])[:top]:
        print(f"| {key} | {value:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--models", default="mlp,cnn,gpt")
    parser.add_argument("--top", type=int, default=14)
    args = parser.parse_args()
    cases = minidist_cases(np.random.default_rng(0))
    try:
        import torch
        torch.set_num_threads(1)
        references = torch_steps(torch, {name: data for name, (_, _, data) in cases.items()})
    except ImportError:
        torch = None
    print(f"one thread; load average {os.getloadavg()[0]:.1f}; ms per step over {args.steps} steps")
    for name in args.models.split(","):
        model, step, _ = cases[name]
        print_table(f"{name}: minidist module", time_modules(model, step, args.steps), args.top)
        if torch is not None:
            ops = torch_profile(torch, references[name], args.steps)
            products = sum(v for k, v in ops.items() if k in PRODUCTS)
            rest = sum(ops.values()) - products
            ops["(products: " + ", ".join(k for k in PRODUCTS if k in ops) + ")"] = products
            ops["(everything else)"] = rest
            print_table(f"{name}: torch operator (self CPU)", ops, args.top)


if __name__ == "__main__":
    main()
