"""``python -m minidist demo``: train a small MLP on the real handwritten digits, in one process.

It prints the training loss and test accuracy per epoch, then draws the loss curve to
figures/00_demo_loss.png. Everything is seeded: two runs print the same numbers, bit for bit.
(Later parts of the course run the same model on a simulated cluster.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from minidist.data import iterate_batches, load_digits
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD

FIGURES = Path(__file__).resolve().parent.parent / "figures"


@dataclass
class TrainingRun:
    model: Sequential
    epoch_losses: list[float] = field(default_factory=list)     # mean training loss per epoch
    test_accuracies: list[float] = field(default_factory=list)  # after each epoch
    step_losses: list[float] = field(default_factory=list)      # every mini-batch


def digits_mlp(rng: np.random.Generator, hidden: int = 64, dtype=np.float32) -> Sequential:
    """64 pixels -> hidden -> hidden -> 10 classes, ReLU in between."""
    return Sequential(Linear(64, hidden, rng=rng, dtype=dtype), ReLU(),
                      Linear(hidden, hidden, rng=rng, dtype=dtype), ReLU(),
                      Linear(hidden, 10, rng=rng, dtype=dtype))


def accuracy(model: Sequential, x: np.ndarray, y: np.ndarray) -> float:
    return float((model.forward(x).argmax(axis=1) == y).mean())


def train_digits_mlp(epochs: int = 15, seed: int = 0, batch_size: int = 32, lr: float = 0.1,
                     momentum: float = 0.9, hidden: int = 64) -> TrainingRun:
    """Mini-batch SGD with momentum and a linearly decaying learning rate on the digits; one seed fixes
    the weights and the batch order."""
    data = load_digits()
    init_rng, batch_rng = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
    run = TrainingRun(model=digits_mlp(init_rng, hidden))
    loss_fn = CrossEntropyLoss()
    optimizer = SGD(run.model.parameters(), lr=lr, momentum=momentum)
    for epoch in range(epochs):
        optimizer.lr = lr * (1 - epoch / epochs)  # linear decay: large steps first, then settle
        losses = []
        for idx in iterate_batches(len(data.y_train), batch_size, batch_rng):
            loss = loss_fn.forward(run.model.forward(data.x_train[idx]), data.y_train[idx])
            optimizer.zero_grad()
            run.model.backward(loss_fn.backward())
            optimizer.step()
            losses.append(loss)
        run.step_losses.extend(losses)
        run.epoch_losses.append(float(np.mean(losses)))
        run.test_accuracies.append(accuracy(run.model, data.x_test, data.y_test))
    return run


def plot_losses(run: TrainingRun, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps_per_epoch = len(run.step_losses) // len(run.epoch_losses)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(np.arange(len(run.step_losses)) / steps_per_epoch, run.step_losses, lw=0.6, alpha=0.5,
            label="mini-batch loss")
    ax.plot(np.arange(len(run.epoch_losses)) + 0.5, run.epoch_losses, "o-", label="epoch mean")
    ax.set(yscale="log", xlabel="epoch", ylabel="cross-entropy loss",
           title=f"MLP on the digits: test accuracy {run.test_accuracies[-1]:.1%}")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    from threadpoolctl import threadpool_limits  # comes with scikit-learn

    # Small matrices: one BLAS thread is fastest (several threads that wait for each other after every
    # small product are many times slower on a busy machine).
    threadpool_limits(limits=1, user_api="blas")
    start = time.perf_counter()
    print("minidist demo: a 64-64-64-10 MLP learns the handwritten digits (1,437 train / 360 test images)")
    print("with mini-batch SGD (batch 32, momentum 0.9, lr 0.1 decaying linearly), every backward pass by hand.\n")
    run = train_digits_mlp()
    print(f"{'epoch':>5}  {'train loss':>10}  {'test accuracy':>13}")
    for epoch, (loss, acc) in enumerate(zip(run.epoch_losses, run.test_accuracies), start=1):
        print(f"{epoch:>5}  {loss:>10.4f}  {acc:>13.1%}")
    path = FIGURES / "00_demo_loss.png"
    plot_losses(run, path)
    print(f"\ntest accuracy {run.test_accuracies[-1]:.1%} after {len(run.epoch_losses)} epochs "
          f"({run.model.num_parameters():,} parameters, {time.perf_counter() - start:.1f} s)")
    print(f"loss curve: {path}")
    return 0
