"""Training step time against the channels left, for a CNN shrunk PruneTrain-style (one thread).

    PYTHONPATH=. python benchmarks/prune_train.py [--repeats 7] [--steps 5]

Model (float32): Conv(1→16, 3x3, pad 1) ReLU MaxPool(2) Conv(16→32, 3x3, pad 1) ReLU MaxPool(2)
Linear(32·7·7→10), batch 64, random input (64, 1, 28, 28). Stage by stage, a fraction of each conv's
channels is zeroed (filter and bias, as group lasso leaves them) and cut out with
minidist.nn.prune_train.shrink_channels, the SGD optimizer's momentum buffers sliced alongside; then the
best of ``repeats`` timings of ``steps`` training steps (forward, loss, backward, SGD with momentum).
Prints the training FLOPs per step and the step time, each relative to the dense model.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ[_var] = "1"  # must happen before NumPy loads its BLAS

import argparse
import time

import numpy as np

from minidist.nn import Conv2d, CrossEntropyLoss, Flatten, Linear, MaxPool2d, ReLU, Sequential
from minidist.nn.prune_train import shrink_channels, training_flops
from minidist.optim import SGD

KEEP = [1.0, 0.75, 0.5, 0.375, 0.25]  # fraction of the original channels left in each conv


def step_seconds(model, optimizer, x, y, repeats: int, steps: int) -> float:
    loss, best = CrossEntropyLoss(), float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.zero_grad()
            loss.forward(model(x), y)
            model.backward(loss.backward())
            optimizer.step()
        best = min(best, (time.perf_counter() - start) / steps)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    model = Sequential(Conv2d(1, 16, 3, padding=1, rng=rng), ReLU(), MaxPool2d(2),
                       Conv2d(16, 32, 3, padding=1, rng=rng), ReLU(), MaxPool2d(2),
                       Flatten(), Linear(32 * 7 * 7, 10, rng=rng))
    optimizer = SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = rng.standard_normal((64, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    base_flops = training_flops(model, x.shape)
    base_time = None
    print("| conv widths | FLOPs / dense | step ms | time / dense |")
    print("|---|---:|---:|---:|")
    for keep in KEEP:
        for conv, width in ((model[0], 16), (model[3], 32)):
            target = round(keep * width)
            conv.weight.data[target:] = 0  # as group lasso leaves a vanished channel: filter and bias 0
            conv.bias.data[target:] = 0
        widths = shrink_channels(model, optimizer)[:2]
        seconds = step_seconds(model, optimizer, x, y, args.repeats, args.steps)
        base_time = base_time or seconds
        print(f"| {widths[0]}, {widths[1]} | {training_flops(model, x.shape) / base_flops:.2f} | "
              f"{1e3 * seconds:.1f} | {seconds / base_time:.2f} |")


if __name__ == "__main__":
    main()
