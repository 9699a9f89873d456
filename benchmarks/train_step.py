"""Time one training step (forward, loss, backward, SGD update) of minidist against PyTorch, one thread.

    PYTHONPATH=. python benchmarks/train_step.py [--repeats 7] [--steps 5]

Models (float32):
    MLP  1024-1024-1024-10 (ReLU), batch 256, input (256, 1024)
    CNN  Conv(1→16, 3x3, pad 1) ReLU MaxPool(2) Conv(16→32, 3x3, pad 1) ReLU MaxPool(2) Linear(1568→10),
         batch 64, input (64, 1, 28, 28)
Both libraries run on one CPU thread (BLAS thread count set before NumPy is imported,
torch.set_num_threads(1)). Prints samples/s and minidist's throughput as a fraction of PyTorch's; the
best of ``repeats`` timings of ``steps`` steps each is reported (the least disturbed by other jobs).

The models are written as a user writes them. minidist runs each step two ways: "backward", the
hand-written loop (model.backward returns dx, also the batch's), and "runner", minidist.nn.runner's
StepRunner, which knows the batch needs no gradient and skips the first layer's dx (the first Linear's
product, the first Conv2d's product and col2im: as torch, which skips the gradient of an input without
requires_grad). The "torch+dx" column, torch computing the input's gradient too, is the like-for-like
comparison for "backward".
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ[_var] = "1"  # must happen before NumPy loads its BLAS

import argparse
import time

import numpy as np

from minidist.nn import Conv2d, CrossEntropyLoss, Flatten, Linear, MaxPool2d, ReLU, Sequential
from minidist.nn.runner import StepRunner
from minidist.optim import SGD


def minidist_mlp(rng):
    return Sequential(Linear(1024, 1024, rng=rng), ReLU(), Linear(1024, 1024, rng=rng),
                      ReLU(), Linear(1024, 10, rng=rng))


def minidist_cnn(rng):
    return Sequential(Conv2d(1, 16, 3, padding=1, rng=rng), ReLU(), MaxPool2d(2),
                      Conv2d(16, 32, 3, padding=1, rng=rng), ReLU(), MaxPool2d(2),
                      Flatten(), Linear(32 * 7 * 7, 10, rng=rng))


def torch_models(torch):
    nn = torch.nn
    mlp = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                        nn.Linear(1024, 10))
    cnn = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(32 * 7 * 7, 10))
    return mlp, cnn


def best_times(steps_by_name: dict, steps: int, repeats: int) -> dict[str, float]:
    """Seconds per step for each step function: the best of `repeats` runs of `steps` steps, the
    functions taking turns (so that a burst of load from other jobs hits both alike), after warm-up."""
    for step in steps_by_name.values():
        step()
        step()
    best = dict.fromkeys(steps_by_name, float("inf"))
    for _ in range(repeats):
        for name, step in steps_by_name.items():
            start = time.perf_counter()
            for _ in range(steps):
                step()
            best[name] = min(best[name], (time.perf_counter() - start) / steps)
    return best


def minidist_step(model, x, y):
    """The hand-written loop: model.backward also computes the batch's gradient."""
    loss_fn = CrossEntropyLoss()
    optimizer = SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        loss_fn.forward(model.forward(x), y)
        optimizer.zero_grad()
        model.backward(loss_fn.backward())
        optimizer.step()
    return step


def runner_step(model, x, y):
    """The step runner: forward, loss, backward without the batch's gradient."""
    runner = StepRunner(model, CrossEntropyLoss())
    optimizer = SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        optimizer.zero_grad()
        runner.forward_backward(x, y)
        optimizer.step()
    return step


def torch_step(torch, model, x, y, input_grad: bool):
    """input_grad=True makes torch also compute the gradient of the input batch, as minidist's
    backward always does (Module.backward returns dx): the same arithmetic on both sides."""
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    tx, ty = torch.from_numpy(x).requires_grad_(input_grad), torch.from_numpy(y)

    def step():
        loss = loss_fn(model(tx), ty)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    cases = {
        "MLP 1024-1024-1024-10, batch 256": (minidist_mlp(rng), rng.standard_normal((256, 1024)), 256),
        "CNN 2x(conv3x3+pool) on 1x28x28, batch 64":
            (minidist_cnn(rng), rng.standard_normal((64, 1, 28, 28)), 64),
    }
    try:
        import torch

        torch.set_num_threads(1)
        torch_mlp, torch_cnn = torch_models(torch)
    except ImportError:
        torch = None
        print("PyTorch is not installed: timing minidist only")

    print("samples/s; ratios against torch. 'backward': model.backward (computes the batch's gradient);\n"
          "'runner': StepRunner (skips it, as torch does); 'torch+dx' also computes the input's gradient\n")
    print(f"{'model':43s} {'backward':>9s} {'runner':>9s} {'torch':>9s} {'ratio':>6s} "
          f"{'torch+dx':>9s} {'ratio':>6s}")
    torch_cases = (torch_mlp, torch_cnn) if torch else (None, None)
    for (name, (model, x, batch)), torch_model in zip(cases.items(), torch_cases):
        x = x.astype(np.float32)
        y = rng.integers(0, 10, batch)
        steps = {"backward": minidist_step(model, x, y), "runner": runner_step(model, x, y)}
        if torch is not None:
            steps["torch"] = torch_step(torch, torch_model, x, y, input_grad=False)
            steps["torch+dx"] = torch_step(torch, torch_model, x, y, input_grad=True)
        rate = {key: batch / t for key, t in best_times(steps, args.steps, args.repeats).items()}
        mine = f"{name:43s} {rate['backward']:9.0f} {rate['runner']:9.0f}"
        if torch is None:
            print(mine)
        else:
            print(f"{mine} {rate['torch']:9.0f} {rate['backward'] / rate['torch']:5.2f}x/"
                  f"{rate['runner'] / rate['torch']:4.2f}x {rate['torch+dx']:9.0f} "
                  f"{rate['backward'] / rate['torch+dx']:5.2f}x/{rate['runner'] / rate['torch+dx']:4.2f}x")


if __name__ == "__main__":
    main()
