"""``python -m minidist demo``: train a small MLP on the real handwritten digits, data-parallel.

The model trains on 4 simulated accelerators (minidist.cluster: one process each) that average their
gradients with a ring allreduce, bucket by bucket, overlapped with the backward pass
(minidist.parallel.data). The demo then trains the same model in one process and prints the largest
difference between the two sets of final parameters, the traffic ledger (bytes each rank sent, against
the ring formula 2(P-1)/P·|W|), the simulated time, the wall-clock time and, in one line, where the
distributed run's wall-clock time went (``wall_breakdown``: the ranks' minidist.cluster.wall counters).
It draws the loss curve (figures/00_demo_loss.png), the timeline of the last step
(figures/00_demo_timeline.png), and writes a Chrome trace of that step to the temporary directory.
Everything is seeded: two runs print the same numbers, bit for bit (the wall-clock times aside).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from minidist.cluster import Device, LinkModel, Trace, run_traced
from minidist.collectives.pieces import split_range
from minidist.data import Dataset, iterate_batches, load_digits
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD
from minidist.parallel.data import DataParallel
from minidist.parallel.data.overlap import save_overlap_chrome
from minidist.sim.collective_cost import allreduce_cost
from minidist.sim.plots import figures_dir, plot_overlap, write_png

FIGURES: Path | None = None  # None: minidist.sim.plots.figures_dir() (figures/, or $MINIDIST_FIGURES)


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
                     momentum: float = 0.9, hidden: int = 64, data: Dataset | None = None) -> TrainingRun:
    """Mini-batch SGD with momentum and a linearly decaying learning rate on the digits; one seed fixes
    the weights and the batch order. ``data``: load_digits(), loaded here if not given."""
    data = load_digits() if data is None else data
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
    write_png(fig, path, dpi=110)
    plt.close(fig)


WORLD_SIZE = 4
BUCKET_BYTES = 16 * 2**10  # small buckets, so that this small model has several (DDP's default: 25 MiB)
# A 10 GFLOP/s accelerator (about one laptop core) and the default NVLink-class link: for this small
# model, compute and communication then take comparable time, so the overlap is visible.
DEVICE, LINK = Device(flops=10e9), LinkModel()


def train_digits_data_parallel(comm, epochs: int = 15, seed: int = 0, batch_size: int = 32, lr: float = 0.1,
                               momentum: float = 0.9, hidden: int = 64, data: Dataset | None = None) -> dict:
    """train_digits_mlp on every rank of ``comm``: the same seed (identical replicas, the same batch order),
    each rank computing on its shard of every global batch; returns what the parent needs, with the real
    seconds of its steps (``wall``: step, in_calls, waiting; sleeps; the rest of the function: ``other``)."""
    began, wall = time.perf_counter(), comm.wall
    data = load_digits() if data is None else data
    init_rng, batch_rng = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
    model = digits_mlp(init_rng, hidden)
    optimizer = SGD(model.parameters(), lr=lr, momentum=momentum)
    dp = DataParallel(comm, model, optimizer, CrossEntropyLoss(), algorithm="ring", bucket_bytes=BUCKET_BYTES)
    start_bytes, start_clock = comm.stats.bytes_sent, comm.clock
    losses, sizes, accuracies, steps = [], [], [], 0
    calls, waiting, sleeps, step_seconds = wall.in_calls, wall.waiting, wall.sleeps, 0.0
    for epoch in range(epochs):
        optimizer.lr = lr * (1 - epoch / epochs)
        for idx in iterate_batches(len(data.y_train), batch_size, batch_rng):
            last_step_start, dp.clock.spans = comm.clock, []
            comm.drop_spans()                        # only the last step's spans travel back
            step_began = time.perf_counter()
            losses.append(dp.train_step(data.x_train[idx], data.y_train[idx]))
            step_seconds += time.perf_counter() - step_began
            lo, hi = split_range(len(idx), comm.world_size, comm.rank)
            sizes.append(hi - lo)                    # this rank's share of the batch, to weight its loss
            steps += 1
        accuracies.append(accuracy(model, data.x_test, data.y_test) if comm.rank == 0 else None)
    bytes_per_step, train_clock = (comm.stats.bytes_sent - start_bytes) / steps, comm.clock - start_clock
    step_wall = {"step": step_seconds, "in_calls": wall.in_calls - calls, "waiting": wall.waiting - waiting,
                 "sleeps": wall.sleeps - sleeps}      # (the steps only: accuracy and checks excluded)
    dp.check_replicas()                              # the replicas end bitwise identical (else ValueError)
    return {
        "wall": {**step_wall, "other": time.perf_counter() - began - step_seconds},
        "params": [p.data for p in model.parameters()],
        "losses": losses,
        "sizes": sizes,
        "accuracies": accuracies,
        "steps": steps,
        "bytes_per_step": bytes_per_step,
        "train_clock": train_clock,
        "last_step": (last_step_start, comm.clock),
        "last_compute": dp.clock.spans,
        "gradient_bytes": sum(p.data.nbytes for p in model.parameters()),
        "buckets": [b.nbytes for b in dp.buckets],
    }


def wall_breakdown(results: list[dict], trace: Trace, wall: float) -> str:
    """One line: where the distributed run's ``wall`` seconds went, from the ranks' counters (rank means;
    minidist.cluster.wall): start-up, then per step compute / messages / waiting, then the rest."""
    mean = {key: float(np.mean([r["wall"][key] for r in results])) for key in results[0]["wall"]}
    steps = results[0]["steps"]
    per_step = {"compute": mean["step"] - mean["in_calls"], "messages": mean["in_calls"] - mean["waiting"],
                "waiting": mean["waiting"]}
    parts = ", ".join(f"{name} {seconds / steps * 1e3:.2f} ms" for name, seconds in per_step.items())
    return (f"where the {wall:.1f} s went (mean over ranks): start-up {trace.startup:.2f} s (fork, shared "
            f"memory); {steps} steps of {mean['step'] / steps * 1e3:.2f} ms = {parts} "
            f"({mean['sleeps'] / steps:.1f} sleeps per step, {os.cpu_count()} cores); outside the steps "
            f"{mean['other']:.2f} s (set-up, checks, accuracy) and {trace.shutdown:.2f} s (results and spans "
            f"back)")


def last_step_trace(trace: Trace, start: float, end: float) -> Trace:
    """The spans of the last step only (a whole run would make a large trace)."""
    return Trace([s for s in trace.spans if s.start >= start - 1e-12 and s.end <= end + 1e-12],
                 trace.clocks, trace.stats)


def main(epochs: int = 15) -> int:
    from threadpoolctl import threadpool_limits  # comes with scikit-learn

    # Small matrices: one BLAS thread is fastest (several threads that wait for each other after every
    # small product are many times slower on a busy machine).
    threadpool_limits(limits=1, user_api="blas")
    start = time.perf_counter()
    data = load_digits()        # once, here: the ranks inherit it (each importing scikit-learn took ~1 s)
    loaded = time.perf_counter()
    print(f"minidist demo: a 64-64-64-10 MLP learns the handwritten digits (1,437 train / 360 test images)\n"
          f"with mini-batch SGD (global batch 32, momentum 0.9, lr 0.1 decaying linearly), data-parallel on\n"
          f"{WORLD_SIZE} simulated accelerators ({DEVICE.flops / 1e9:.0f} GFLOP/s each, links alpha = "
          f"{LINK.alpha * 1e6:.0f} us, {1 / LINK.beta / 1e9:.0f} GB/s) with ring allreduce.\n")
    dp_start = time.perf_counter()
    results, trace = run_traced(train_digits_data_parallel, WORLD_SIZE, epochs, 0, 32, 0.1, 0.9, 64, data,
                                link=LINK, device=DEVICE, timeout=120.0)
    wall_dp = time.perf_counter() - dp_start
    out = results[0]
    # the global loss of a step: each rank's shard mean weighted by its share of the batch
    step_losses = np.sum([np.multiply(r["losses"], r["sizes"]) for r in results], axis=0) / np.sum(
        [r["sizes"] for r in results], axis=0)
    steps_per_epoch = out["steps"] // epochs
    print(f"{'epoch':>5}  {'train loss':>10}  {'test accuracy':>13}")
    for epoch in range(epochs):
        loss = step_losses[epoch * steps_per_epoch:(epoch + 1) * steps_per_epoch].mean()
        print(f"{epoch + 1:>5}  {loss:>10.4f}  {out['accuracies'][epoch]:>13.1%}")

    single_start = time.perf_counter()
    single = train_digits_mlp(epochs=epochs, data=data)
    wall_single = time.perf_counter() - single_start
    diff = max(float(np.max(np.abs(a - p.data))) for a, p in zip(out["params"], single.model.parameters()))
    print(f"\nsame training in one process: max |difference| of the final parameters = {diff:.2e}\n"
          f"(float32, and the allreduce adds the gradients in another order than one process does)")

    # ledger: every rank sent the same bytes; the ring moves 2(P-1)/P of each bucket per rank
    cost = sum(
        allreduce_cost("ring", WORLD_SIZE, n, LINK.alpha, LINK.beta).bytes_sent[0] for n in out["buckets"]
    )
    formula = 2 * (WORLD_SIZE - 1) / WORLD_SIZE * out["gradient_bytes"]
    print(f"ledger: bytes sent per rank per step {[round(r['bytes_per_step']) for r in results]}; "
          f"formula 2(P-1)/P·|W| = {formula:.0f} (|W| = {out['gradient_bytes']} bytes in "
          f"{len(out['buckets'])} buckets; sum of the per-bucket formula {cost:.0f}; ranks differ by a few "
          f"bytes because the ring's chunks differ by one element when a bucket does not divide by P)")
    print(f"simulated time of {epochs} epochs: {out['train_clock'] * 1e3:.1f} ms on the modelled machine "
          f"({out['train_clock'] / out['steps'] * 1e6:.0f} us per step)\nwall-clock: {wall_dp:.2f} s with "
          f"{WORLD_SIZE} processes (fork, set-up, {out['steps']} steps, accuracy per epoch, replica check, "
          f"results back), {wall_single:.2f} s in one process (the same {out['steps']} steps and accuracies, "
          f"no fork): {wall_dp / wall_single:.0f}x; the digits were loaded once before both, in "
          f"{loaded - start:.1f} s")
    print(wall_breakdown(results, trace, wall_dp))

    step_trace = last_step_trace(trace, *out["last_step"])
    figures = Path(FIGURES) if FIGURES is not None else figures_dir()
    figures.mkdir(parents=True, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_overlap(step_trace, [r["last_compute"] for r in results], path=figures / "00_demo_timeline.png",
                 title="one data-parallel step: backward overlapped with the bucket allreduces")
    plt.close("all")
    chrome = save_overlap_chrome(step_trace, [r["last_compute"] for r in results],
                                 Path(tempfile.gettempdir()) / "minidist_00_demo_trace.json")
    run = TrainingRun(model=single.model, epoch_losses=[float(step_losses[e * steps_per_epoch:(e + 1) *
                      steps_per_epoch].mean()) for e in range(epochs)], test_accuracies=out["accuracies"],
                      step_losses=list(step_losses))
    plot_losses(run, figures / "00_demo_loss.png")
    print(f"\ntest accuracy {out['accuracies'][-1]:.1%} after {epochs} epochs "
          f"({single.model.num_parameters():,} parameters, {time.perf_counter() - start:.1f} s)")
    print(f"loss curve: {figures / '00_demo_loss.png'}; timeline: {figures / '00_demo_timeline.png'}; "
          f"Chrome trace of the last step (open in https://ui.perfetto.dev): {chrome}")
    return 0
