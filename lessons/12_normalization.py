# %% [markdown]
# # 12 — Normalisation at scale
#
# **Goal.** See why batch normalisation ties a model to its parallel layout, and what to do about it:
# synchronised batch norm (one small allreduce each way), batch-free normalisers (GroupNorm, LayerNorm)
# and Online Normalization, which needs no batch at all.
#
# Source: Pedram & Olukotun, "Hardware Accelerators for Training Deep Neural Networks", "Normalization": batch
# norm computes, per channel, over the mini-batch B
#
#     μ_B = mean_B(x),  σ²_B = mean_B((x − μ_B)²),  x̂ = (x − μ_B)/√(σ²_B + ε),  y = γ x̂ + β
#
# — "a statistical operator: each output depends on *all* samples". Whoever holds "the batch" decides
# the result: a data-parallel rank holds n_r samples, a pipeline stage one micro-batch, a spatial rank a
# block of every image. Online Normalization replaces μ_B, σ²_B by running estimates and corrects the
# backward pass with two accumulated errors (its four properties are on the slides).

# %%
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.cluster import run
from minidist.data import iterate_batches, load_digits
from minidist.nn import (
    BatchNorm1d,
    CrossEntropyLoss,
    GroupNorm,
    LayerNorm,
    Linear,
    OnlineNorm,
    ReLU,
    Sequential,
)
from minidist.optim import SGD
from minidist.parallel.data import DataParallel
from minidist.parallel.pipeline import Pipeline
from minidist.parallel.sync_batchnorm import convert_sync_batchnorm
from minidist.sim.plots import save_figure

START = time.perf_counter()
DATA = load_digits(dtype=np.float64)
HIDDEN = 32


def mlp(norm, seed=0):
    """64 → 32 → norm → ReLU → 10 on the digits."""
    rng = np.random.default_rng(seed)
    return Sequential(Linear(64, HIDDEN, rng=rng, dtype=np.float64), norm(), ReLU(),
                      Linear(HIDDEN, 10, rng=rng, dtype=np.float64))


NORMS = {
    "BatchNorm": lambda: BatchNorm1d(HIDDEN, dtype=np.float64),
    "GroupNorm": lambda: GroupNorm(4, HIDDEN, dtype=np.float64),
    "LayerNorm": lambda: LayerNorm(HIDDEN, dtype=np.float64),
    "OnlineNorm": lambda: OnlineNorm(HIDDEN, alpha_fwd=0.99, alpha_bkw=0.99, dtype=np.float64),
}

# %% [markdown]
# ## 1. Four ranks, one batch: plain BatchNorm is not the single-process model, SyncBatchNorm is
#
# A global batch of 32 over P = 4 ranks. With plain BatchNorm each rank normalises its 8 samples by
# their own statistics (DDP without SyncBatchNorm); `convert_sync_batchnorm` swaps every BatchNorm for
# a SyncBatchNorm, whose statistics come from one allreduce of (count, Σx, Σx²) over all ranks.

# %%
P, GLOBAL = 4, 32
X, Y = DATA.x_train[:GLOBAL], DATA.y_train[:GLOBAL]


def dp_steps(comm, sync, steps=5):
    model = mlp(NORMS["BatchNorm"])
    if sync:
        convert_sync_batchnorm(model, comm, algorithm="recursive_doubling")
    dp = DataParallel(comm, model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(),
                      algorithm="recursive_doubling", bucket_bytes=None)
    sent = []
    for _ in range(steps):
        before = comm.stats.bytes_sent
        dp.train_step(X, Y)
        sent.append(comm.stats.bytes_sent - before)
    return model.state_dict(), sent


reference = mlp(NORMS["BatchNorm"])
optimizer, loss_fn = SGD(reference.parameters(), lr=0.1), CrossEntropyLoss()
for _ in range(5):
    optimizer.zero_grad()
    loss_fn.forward(reference.forward(X), Y)
    reference.backward(loss_fn.backward())
    optimizer.step()
want = reference.state_dict()


def worst(state):
    return max(np.abs(state[k] - want[k]).max() / np.abs(want[k]).max() for k in want)


plain, synced = run(dp_steps, P, False, timeout=120), run(dp_steps, P, True, timeout=120)
print(f"after 5 steps, largest relative difference from one process: plain BN {worst(plain[0][0]):.2e}, "
      f"SyncBN {worst(synced[0][0]):.2e}")
assert worst(plain[0][0]) > 1e-3 and worst(synced[0][0]) < 1e-9

# %% [markdown]
# ## 2. What SyncBatchNorm costs (the ledger)
#
# Per BatchNorm layer of C channels and per step: forward (1 + 2C) float64 numbers, backward 2C numbers.
# Recursive doubling sends log₂P · n · 8 bytes per rank for n numbers, the same rule as the gradient
# allreduce of the model's parameters — so the extra fraction is about (4C + 1) / #parameters.

# %%
C, n_params = HIDDEN, reference.num_parameters()
extra = synced[0][1][-1] - plain[0][1][-1]
assert extra == int(np.log2(P)) * ((1 + 2 * C) + 2 * C) * 8
assert plain[0][1][-1] == int(np.log2(P)) * n_params * 8
print(f"bytes sent per rank and step: gradients {plain[0][1][-1]}, SyncBN adds {extra} "
      f"({100 * extra / plain[0][1][-1]:.1f}% for {n_params} parameters and {C} channels)")

# %% [markdown]
# ## 3. Accuracy against the batch a normaliser sees
#
# Each normaliser trains the digits MLP on 800 samples with SGD at the per-rank batch b = 1, 2, 8, 32
# (then eval on the held-out digits). Plain BatchNorm under data parallelism sees b samples; SyncBN on
# P = 4 ranks sees 4b (shown in §1 to be BatchNorm on the global batch, so it is computed so here).
# BatchNorm cannot train at b = 1 at all (one value per channel has no variance). The sample budget is
# fixed, so large batches take few steps: compare the columns at small b, where the normalisers differ.

# %%
BATCHES = (1, 2, 8, 32)


def accuracy(norm, batch, norm_batch=None, samples=800):
    model, loss_fn = mlp(norm), CrossEntropyLoss()
    optimizer = SGD(model.parameters(), lr=0.05 * min(batch, 8) ** 0.5)
    try:
        for idx in iterate_batches(samples, norm_batch or batch, np.random.default_rng(1)):
            optimizer.zero_grad()
            loss_fn.forward(model.forward(DATA.x_train[idx]), DATA.y_train[idx])
            model.backward(loss_fn.backward())
            optimizer.step()
    except ValueError:
        return float("nan")              # BatchNorm with one sample: cannot train
    model.eval()
    return float((model.forward(DATA.x_test).argmax(axis=1) == DATA.y_test).mean())


table = {name: [accuracy(norm, b) for b in BATCHES] for name, norm in NORMS.items()}
table["SyncBN (P=4)"] = [accuracy(NORMS["BatchNorm"], b, norm_batch=P * b) for b in BATCHES]
print("per-rank batch      " + "".join(f"{b:>8}" for b in BATCHES))
for name, row in table.items():
    print(f"{name:<20}" + "".join(f"{a:>8.3f}" for a in row))
assert np.isnan(table["BatchNorm"][0])
assert min(table["OnlineNorm"][:2]) > 0.7 and table["OnlineNorm"][1] > table["BatchNorm"][1] + 0.05
assert table["SyncBN (P=4)"][1] > table["BatchNorm"][1]

fig, ax = plt.subplots(figsize=(6, 3.6), constrained_layout=True)
for name, row in table.items():
    ax.plot(BATCHES, row, marker="o", label=name)
ax.set(xscale="log", xticks=BATCHES, xticklabels=[str(b) for b in BATCHES], xlabel="per-rank batch size",
       ylabel="test accuracy", title="Digits MLP: normaliser vs batch size")
ax.legend(fontsize=8)
save_figure(fig, "12_normalization_batch_size.png")
plt.close(fig)

# %% [markdown]
# ## 4. Pipelines normalise per micro-batch
#
# `Pipeline` runs BatchNorm on each micro-batch separately (as GPipe does): the same weights and batch
# give a different loss for every M. GroupNorm and LayerNorm normalise each sample alone, so their loss
# does not depend on M — the remedy (accumulated statistics across micro-batches would be the other).

# %%
MICRO = (1, 2, 4, 8)


def pipeline_losses(comm, name):
    losses = []
    for M in MICRO:
        pipe = Pipeline(comm, mlp(NORMS[name]), loss_fn=CrossEntropyLoss(), num_micro_batches=M)
        losses.append(pipe.train_step(X, Y, SGD(pipe.parameters(), lr=0.0)))
    return losses


pipeline = {name: run(pipeline_losses, 2, name, timeout=120)[-1]
            for name in ("BatchNorm", "GroupNorm", "LayerNorm")}
for name, losses in pipeline.items():
    print(f"{name:<10} loss with M = {MICRO}: " + ", ".join(f"{v:.6f}" for v in losses))
assert np.ptp(pipeline["BatchNorm"]) > 1e-3
assert np.ptp(pipeline["GroupNorm"]) < 1e-12 and np.ptp(pipeline["LayerNorm"]) < 1e-12

fig, ax = plt.subplots(figsize=(6, 3.2))
for name, losses in pipeline.items():
    ax.plot(MICRO, losses, marker="o", label=name)
ax.set(xscale="log", xticks=MICRO, xticklabels=[str(m) for m in MICRO], xlabel="micro-batches M",
       ylabel="loss of one batch of 32",
       title="Pipeline (2 stages): the loss depends on M only with BatchNorm")
ax.legend(fontsize=8)
save_figure(fig, "12_normalization_pipeline.png")
plt.close(fig)

# %% [markdown]
# ## 5. Spatial parallelism
#
# A spatial rank holds a block of every image, so a channel's statistics are spread over all ranks:
# `spatialize` turns each BatchNorm2d into a `SpatialBatchNorm2d`, the same allreduce of (count, Σx,
# Σx²) over the grid, whose backward's allreduce of (Σdy, Σdy·x̂) also gives dβ and dγ
# (tests/parallel/test_parallel_spatial_batchnorm.py checks the equality with one process).

# %% [markdown]
# ## 6. What batch norm buys, and what it costs in memory
#
# Why put up with it? The tutorial: batch norm smooths the loss landscape, so a network trains at a
# larger learning rate and faster (Ioffe & Szegedy; Santurkar et al.). The same 64-64-64-10 MLP with and
# without BatchNorm after each hidden Linear, SGD with momentum 0.9, batch 32, three epochs, at the rate
# that suits the plain network (0.05) and at 10× that. The price is the batch itself: batch norm needs
# 32-128 samples per step to estimate its statistics, and every sample's activations are kept for
# backward. The tutorial's table (Chiley et al. 2019, memory for training in GB): ResNet-50 on ImageNet
# 1 / 2 / 4 and U-Net on 250³ voxels 6 / 195 / 785 for Online Norm at batch 1 / batch norm at 32 / 128.
# We measure the same with the memory ledger on a small CNN: activations held after forward.


# %%
from minidist.nn import BatchNorm2d, Conv2d  # noqa: E402
from minidist.sim.memory import held_bytes  # noqa: E402


def deep_mlp(with_bn, seed=0):
    rng, layers = np.random.default_rng(seed), []
    for width_in in (64, 64):
        layers += [Linear(width_in, 64, rng=rng, dtype=np.float64)]
        layers += [BatchNorm1d(64, dtype=np.float64)] if with_bn else []
        layers += [ReLU()]
    return Sequential(*layers, Linear(64, 10, rng=rng, dtype=np.float64))


def train_at(with_bn, lr, epochs=3):
    model, loss_fn, losses = deep_mlp(with_bn), CrossEntropyLoss(), []
    optimizer = SGD(model.parameters(), lr=lr, momentum=0.9)
    for epoch in range(epochs):
        for idx in iterate_batches(len(DATA.y_train), 32, np.random.default_rng(epoch)):
            optimizer.zero_grad()
            losses.append(loss_fn.forward(model.forward(DATA.x_train[idx]), DATA.y_train[idx]))
            model.backward(loss_fn.backward())
            optimizer.step()
    model.eval()
    return losses, float((model.forward(DATA.x_test).argmax(axis=1) == DATA.y_test).mean())


runs = {(bn, lr): train_at(bn, lr) for bn in (False, True) for lr in (0.05, 0.5)}
for (bn, lr), (losses, acc) in runs.items():
    print(f"{'BatchNorm' if bn else 'plain':9s} lr {lr:4}: last-10-step loss {np.mean(losses[-10:]):.3f}, "
          f"test accuracy {acc:.3f}")
assert runs[False, 0.5][1] < 0.3 < 0.85 < runs[True, 0.5][1]                # 10x the rate: only BN trains
assert np.mean(runs[True, 0.05][0][-10:]) < np.mean(runs[False, 0.05][0][-10:])  # and faster at the base rate

fig, ax = plt.subplots(figsize=(6, 3.4), constrained_layout=True)
for (bn, lr), (losses, _) in runs.items():
    smooth = np.convolve(losses, np.ones(10) / 10, mode="valid")
    ax.plot(smooth, ls="-" if bn else "--", label=f"{'BatchNorm' if bn else 'plain'}, lr {lr}")
ax.set(xlabel="step", ylabel="training loss (mean of 10 steps)", ylim=(0, 3),
       title="Digits MLP: batch norm trains at 10x the learning rate")
ax.legend(fontsize=8)
save_figure(fig, "12_normalization_learning_rate.png")
plt.close(fig)


def cnn(norm):
    rng = np.random.default_rng(0)
    return Sequential(Conv2d(1, 16, 3, padding=1, rng=rng), norm(16), ReLU(),
                      Conv2d(16, 16, 3, padding=1, rng=rng), norm(16), ReLU())


memory = {}
for name, norm, batch in (("OnlineNorm", OnlineNorm, 1), ("BatchNorm", BatchNorm2d, 32),
                          ("BatchNorm", BatchNorm2d, 128)):
    model = cnn(norm)
    model.forward(DATA.x_train[:batch].reshape(batch, 1, 8, 8).astype(np.float32))
    memory[name, batch] = held_bytes(model)["activations"]
    print(f"{name:10s} batch {batch:3d}: {memory[name, batch] / 1024:7.1f} KiB of activations held "
          f"for backward")
ratios = [memory["BatchNorm", b] / memory["OnlineNorm", 1] for b in (32, 128)]
print(f"batch norm at 32 and 128 holds {ratios[0]:.0f}x and {ratios[1]:.0f}x Online Norm's at batch 1 "
      f"(the tutorial's U-Net, 250³ voxels: {195 / 6:.0f}x and {785 / 6:.0f}x)")
assert abs(memory["BatchNorm", 128] / memory["BatchNorm", 32] - 4) < 0.01     # linear in the batch
assert 25 < ratios[0] < 33 and 100 < ratios[1] < 130                            # the table's proportions

# %% [markdown]
# ## 7. The mini-batch gradient is no longer an unbiased estimate
#
# The tutorial lists among batch norm's costs: "Violates SGD: true gradient cannot be recovered". SGD's
# promise is that a mini-batch gradient is, on average over the batches, the full-batch gradient: that
# holds when the loss is a sum over samples, L = (1/N) Σᵢ ℓᵢ(w). Batch norm breaks the sum: each sample's
# output, and so its loss, depends on μ_B and σ²_B, i.e. on its batch mates. We check both sides exactly,
# with no sampling: 8 digits, every one of the C(8, 2) = 28 mini-batches of 2, and the mean of their
# gradients against the gradient on all 8 (Linear 64 → 10, then BatchNorm1d or nothing, cross-entropy).
# Each sample lies in 7 of the 28 batches, so without batch norm the mean is the full gradient up to
# rounding.

# %%
from itertools import combinations  # noqa: E402


def small_gradient(with_bn, index):
    """All parameter gradients, concatenated, of the mean loss on DATA.x_train[index] (fresh model)."""
    rng = np.random.default_rng(0)
    layers = [Linear(64, 10, rng=rng, dtype=np.float64)] + ([BatchNorm1d(10, dtype=np.float64)] if with_bn
                                                            else [])
    model, loss_fn = Sequential(*layers), CrossEntropyLoss()
    loss_fn.forward(model.forward(DATA.x_train[index]), DATA.y_train[index])
    model.backward(loss_fn.backward())
    return np.concatenate([p.grad.ravel() for p in model.parameters()])


def relative_bias(with_bn, batch):
    """|mean over all C(8, batch) mini-batches of their gradient − full gradient| / |full gradient|."""
    full = small_gradient(with_bn, np.arange(8))
    batches = [small_gradient(with_bn, list(index)) for index in combinations(range(8), batch)]
    return np.linalg.norm(np.mean(batches, axis=0) - full) / np.linalg.norm(full)


bias = {(with_bn, batch): relative_bias(with_bn, batch) for with_bn in (False, True) for batch in (2, 4, 6)}
for (with_bn, batch), value in bias.items():
    print(f"{'BatchNorm' if with_bn else 'no norm':9s}, batch {batch}: |mean of the mini-batch gradients "
          f"− full| / |full| = {value:.2e}")
assert all(bias[False, batch] < 1e-12 for batch in (2, 4, 6))          # unbiased without batch norm
assert bias[True, 2] > bias[True, 4] > bias[True, 6] > 1e-6            # biased with it, less so as B → N

# %% [markdown]
# The bias is not a rounding effect: with batches of 2 each normalised feature is ±1 (up to ε), whatever
# the two samples were, so the batches see a very different function from the one the full set defines.
# It shrinks as the batch grows towards the set (its statistics nearer the full ones) but is still there
# at 6 of 8: one more reason the batch-norm batch must not be small, and why sections 1-5 care about who
# holds "the batch".

# %%
elapsed = time.perf_counter() - START
print(f"lesson ran in {elapsed:.1f} s")

# %% [markdown]
# ## Exercises
#
# * `sync_batchnorm_backward` (minidist/parallel/sync_batchnorm.py): the backward of SyncBatchNorm —
#   local sums of dy and dy·x̂, one allreduce, then batch norm's backward with the global means.
#   Check: `python -m pytest --exercise sync_batchnorm_backward`
# * Without code: how many bytes would a Welford merge (allgather of (n_r, mean_r, M2_r)) send instead?
