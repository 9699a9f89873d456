"""Time one optimizer step over 10M float32 parameters: minidist.optim vs torch.optim (foreach=False).

Both sides run on one thread (torch.set_num_threads(1); BLAS thread variables set to 1 before NumPy is
imported), update the same three parameter arrays (2000x2000, 2000x2000, 1000x2000 = 10M float32) from
fixed gradients, and report the best and the median of --repeats timed steps after one untimed step that
allocates the optimizer state; minidist's and torch's steps alternate. torch.optim has no LARS; its peer here
is torch.optim.SGD fed the trust-
ratio-scaled gradients, computed in torch (the same composition tests/optim/test_optim_torch.py checks).

    PYTHONPATH=. python benchmarks/optim_step.py [--size 10000000] [--repeats 7]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import statistics
import time

import numpy as np

from minidist.nn import Parameter
from minidist.optim import LARS, SGD, Adagrad, Adam, AdamW, RMSprop

CASES = [  # (label, minidist class, torch.optim name, keyword arguments)
    ("SGD", SGD, "SGD", {"lr": 0.01}),
    ("SGD momentum", SGD, "SGD", {"lr": 0.01, "momentum": 0.9}),
    ("SGD nesterov+wd", SGD, "SGD", {"lr": 0.01, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-4}),
    ("Adam", Adam, "Adam", {"lr": 1e-3}),
    ("Adam amsgrad", Adam, "Adam", {"lr": 1e-3, "amsgrad": True}),
    ("AdamW", AdamW, "AdamW", {"lr": 1e-3, "weight_decay": 1e-2}),
    ("RMSprop", RMSprop, "RMSprop", {"lr": 1e-2}),
    ("RMSprop centered+mom", RMSprop, "RMSprop", {"lr": 1e-2, "centered": True, "momentum": 0.9}),
    ("Adagrad", Adagrad, "Adagrad", {"lr": 1e-2, "lr_decay": 1e-4}),
    ("LARS", LARS, None, {"lr": 1.0, "momentum": 0.9, "weight_decay": 1e-4}),
]


def shapes_for(size: int) -> list[tuple[int, ...]]:
    """Three matrices in the ratio 2:2:1 (2000x2000, 2000x2000, 1000x2000 for 10M)."""
    cols = 2000 if size >= 2000 * 5 else 1
    rows = max(1, size // (5 * cols))
    return [(2 * rows, cols), (2 * rows, cols), (size // cols - 4 * rows, cols)]


def time_interleaved(steps: list, repeats: int) -> list[tuple[float, float]]:
    """(best, median) seconds per step of each function; the functions alternate, so that a machine
    shared with other jobs slows them alike. One untimed call each first (it allocates the state)."""
    for step in steps:
        step()
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(repeats):
        for step, record in zip(steps, times):
            start = time.perf_counter()
            step()
            record.append(time.perf_counter() - start)
    return [(min(t), statistics.median(t)) for t in times]


def torch_step(torch, name, params, kwargs):
    if name is not None:
        return getattr(torch.optim, name)(params, foreach=False, **kwargs).step
    # LARS peer: torch SGD on r·(g + βw), r = η|w| / (|g| + β|w|), η = 0.001
    sgd = torch.optim.SGD(params, lr=kwargs["lr"], momentum=kwargs["momentum"], foreach=False)
    grads = [p.grad.clone() for p in params]
    beta = kwargs["weight_decay"]

    def step():
        with torch.no_grad():
            for p, g in zip(params, grads):
                w_norm, g_norm = torch.linalg.norm(p), torch.linalg.norm(g)
                p.grad = (0.001 * w_norm / (g_norm + beta * w_norm)) * (g + beta * p)
        sgd.step()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
        print("torch is not installed: timing minidist only")

    rng = np.random.default_rng(0)
    shapes = shapes_for(args.size)
    weights = [rng.normal(size=s).astype(np.float32) for s in shapes]
    grads = [rng.normal(scale=0.01, size=s).astype(np.float32) for s in shapes]
    print(f"one step over {sum(w.size for w in weights):,} float32 parameters {shapes}, 1 thread, "
          f"best / median of {args.repeats}")
    print(f"{'optimizer':22s} {'minidist ms':>17s} {'torch ms':>17s} {'ratio (best)':>13s} {'(median)':>13s}")
    for label, cls, torch_name, kwargs in CASES:
        params = [Parameter(w.copy()) for w in weights]
        for p, g in zip(params, grads):
            p.grad[...] = g
        steps = [cls(params, **kwargs).step]
        if torch is not None:
            tparams = [torch.tensor(w.copy()) for w in weights]
            for p, g in zip(tparams, grads):
                p.grad = torch.tensor(g.copy())
            steps.append(torch_step(torch, torch_name, tparams, kwargs))
        timings = time_interleaved(steps, args.repeats)
        ours = timings[0]
        line = f"{label:22s} {ours[0] * 1e3:8.1f} /{ours[1] * 1e3:7.1f}"
        if torch is not None:
            theirs = timings[1]
            ratio = ours[0] / theirs[0]
            line += (
                f" {theirs[0] * 1e3:8.1f} /{theirs[1] * 1e3:7.1f} {ratio:12.2f}x {ours[1] / theirs[1]:12.2f}x"
            )
            line += "" if ratio <= 1.5 else "  (above the 1.5x target)"
        print(line, flush=True)
        del steps, params


if __name__ == "__main__":
    main()
