# %% [markdown]
# # 11 — Asynchronous and compressed SGD
#
# **Goal.** Synchronous data parallelism waits, at every step, for the slowest worker, and sends every
# bit of every gradient. This lesson trains without waiting (parameter servers, stale-synchronous
# bounds, local SGD, elastic averaging, Hogwild!) and without sending everything (1-bit SGD, top-k,
# Deep Gradient Compression), and measures both costs: staleness and lost accuracy.
#
# The seeds: the "Scaling Deep Learning" slides ("Synchronous versus asynchronous SGD": parameter
# server [Dean, NIPS 2012], elastic averaging SGD [Zhang, NIPS 2015], Hogwild [Recht, NIPS 2011],
# 1-bit SGD [Seide, Interspeech 2014] — "send quantized gradients around, keep residuals"); the
# "Hardware Accelerators for Training DNNs" slides ("Asynchronous SGD", "Hogwild!", "Deep Gradient
# Compression", "Momentum Correction"); and "Distributed DL part II": asynchronous methods are adopted
# only when they buy a large speed-up, because they cost accuracy and reproducibility.
#
# Asynchronous SGD with a parameter server (Downpour): every worker repeats
#
#     pull w;  g = ∇ℓ(w) on its own batch;  push g;      the server applies w ← w − lr·g on arrival
#
# so a gradient may be computed on parameters that are τ updates old (its *staleness*).

# %%
from itertools import pairwise
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.cluster import run
from minidist.data import iterate_batches, load_digits
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD
from minidist.parallel.asynchronous import (
    hogwild,
    sparse_problem,
    step_seconds,
    train_elastic,
    train_local_sgd,
    train_parameter_server,
)
from minidist.parallel.compression import DGC, CompressedDataParallel, ErrorFeedback, OneBit, TopK

FIGURES = Path(__file__).resolve().parent.parent / "figures"
FIGURES.mkdir(exist_ok=True)
DATA = load_digits()


def mlp(widths=(64, 64, 10), seed=0):
    rng, layers = np.random.default_rng(seed), []
    for i, (a, b) in enumerate(pairwise(widths)):
        layers += [Linear(a, b, rng=rng)] + ([ReLU()] if i < len(widths) - 2 else [])
    return Sequential(*layers)


def load_flat(model, flat):
    offset = 0
    for p in model.parameters():
        p.data[...] = flat[offset:offset + p.size].reshape(p.shape)
        offset += p.size
    return model


def train_loss(flat):
    """Cross-entropy of the parameters ``flat`` on the whole training set."""
    return CrossEntropyLoss().forward(load_flat(mlp(), flat).forward(DATA.x_train), DATA.y_train)


# %% [markdown]
# ## 1. A straggler: who waits, and what it costs
#
# Four workers and one server (rank 0). Each worker step computes a batch of 16 digits; on the
# simulated clock a step takes 1 ms, except on worker 3, which is **3× slower**
# (`step_seconds(..., slowdown=[1, 1, 1, 3])`). The same table drives five trainers:
#
# * **synchronous** — the parameter server with staleness bound s = 0: nobody starts step k + 1 before
#   everybody pushed step k (the tests check that this *is* synchronous SGD, per parameter);
# * **asynchronous** — no bound: the server applies every push on arrival and replies at once;
# * **stale-synchronous**, s = 2 — a worker may run at most 2 steps ahead of the slowest;
# * **local SGD** — each worker steps alone, the models are averaged (allreduce) every H = 4 steps
#   (learning rate 4 × 0.05: an average of P models moves 1/P as far as the server's sum of P pushes);
# * **elastic averaging** — every τ = 4 steps each worker moves α = 0.2 towards the center variable x̃,
#   and x̃ moves towards the workers by β = 4α: x_r ← x_r − α(x_r − x̃), x̃ ← x̃ + α Σ_r (x_r − x̃).

# %%
WORKERS, STEPS, PER_WORKER, LR = 4, 48, 16, 0.05
SECONDS = step_seconds(WORKERS, STEPS, 1e-3, slowdown=[1, 1, 1, 3])
ORDER = np.random.default_rng(7).permutation(len(DATA.y_train))


def batch(worker, step):
    start = ((step * WORKERS + worker) * PER_WORKER) % (len(ORDER) - PER_WORKER)
    idx = ORDER[start:start + PER_WORKER]
    return DATA.x_train[idx], DATA.y_train[idx]


def server_run(comm, bound):
    return train_parameter_server(comm, mlp(), CrossEntropyLoss(), batch, lr=LR, seconds=SECONDS, bound=bound,
                                  record_every=8)


def periodic_run(comm, how):
    model = mlp()
    optimizer = SGD(model.parameters(), lr=LR * WORKERS)    # averaging divides by P; the server sums
    if how == "local":
        out = train_local_sgd(comm, model, optimizer, CrossEntropyLoss(), batch, seconds=SECONDS, every=4)
        return out["averages"]
    return train_elastic(comm, model, optimizer, CrossEntropyLoss(), batch, seconds=SECONDS, every=4,
                         alpha=0.2)["centers"]


servers = {name: run(server_run, WORKERS + 1, bound)[0]
           for name, bound in [("synchronous", 0), ("asynchronous", None), ("stale-synchronous s=2", 2)]}
curves = {name: [(t, train_loss(w)) for t, w in out["history"]] for name, out in servers.items()}
curves["local SGD, H=4"] = [(t, train_loss(w)) for t, w in run(periodic_run, WORKERS, "local")[0]]
curves["elastic averaging, tau=4"] = [(t, train_loss(w)) for t, w in run(periodic_run, WORKERS, "elastic")[0]]

# samples applied per simulated second while all four workers are still busy (before the first finishes)
horizon = min(SECONDS[:3].sum(axis=1))
rate = {name: PER_WORKER * sum(t <= horizon for t in out["times"]) / horizon for name, out in servers.items()}
for name, out in servers.items():
    print(f"{name:>22}: {rate[name]:8.0f} samples per simulated second, staleness mean "
          f"{np.mean(out['staleness']):.2f}, max {max(out['staleness'])}")
speedup = rate["asynchronous"] / rate["synchronous"]
print(f"asynchronous / synchronous throughput with one worker 3x slower: {speedup:.2f}x")
assert speedup >= 1.5
assert max(servers["synchronous"]["staleness"]) == WORKERS - 1          # rounds: the j-th push saw j updates
assert max(servers["stale-synchronous s=2"]["staleness"]) < max(servers["asynchronous"]["staleness"])

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
for name, curve in curves.items():
    ax1.plot([t * 1e3 for t, _ in curve], [loss for _, loss in curve], ".-", label=name)
ax1.set(xlabel="simulated time (ms)", ylabel="training loss", title="one worker 3x slower, 4 workers")
ax1.legend(fontsize="small")
bins = np.arange(max(servers["asynchronous"]["staleness"]) + 2) - 0.5
for name, out in servers.items():
    ax2.hist(out["staleness"], bins=bins, histtype="step", linewidth=2, label=name)
ax2.set(xlabel="staleness (updates between pull and push)", ylabel="pushes", title="staleness at the server")
ax2.legend(fontsize="small")
fig.tight_layout()
fig.savefig(FIGURES / "11_stragglers.png", dpi=100)
plt.close(fig)
final = {name: curve[-1][1] for name, curve in curves.items()}
print("final training loss:", {name: round(float(v), 3) for name, v in final.items()})
assert curves["asynchronous"][-1][0] <= curves["synchronous"][-1][0]     # it never finishes later

# %% [markdown]
# Synchronous SGD runs at the straggler's pace: every round lasts 3 ms. Asynchronous SGD lets the three
# fast workers go on, so the server applies ~2.5× as many pushes per simulated second (the fast workers
# finish their 48 steps after ~50 ms; from then on only the straggler pushes) — and pays in staleness:
# the fast workers' gradients are a few updates old, the straggler's up to ~10. The bound s
# trades between the two. Local SGD and elastic averaging communicate every 4 steps only, but wait for
# the straggler at each exchange. Per *update*, staleness costs accuracy (Mitliagkas et al., "Asynchrony
# begets momentum": a stale update behaves like implicit momentum, so explicit momentum should drop as
# workers are added); per *second*, the loss curves show who wins with this straggler.
#
# ## 2. Hogwild!: no lock at all, on shared memory
#
# Here the processes are real and the clock is the wall clock: P processes update one weight array in
# shared memory without a lock (Niu, Recht, Ré, Wright), on sparse logistic regression where each
# example touches 10 of 2,000 coordinates. A *conflict* is a write to coordinates that another process
# wrote between our read and our write. The timing depends on the machine and its load, so it is printed,
# not plotted or asserted (benchmarks/hogwild.py measures it properly).

# %%
problem = sparse_problem(6000, 2000, 10, np.random.default_rng(0))
runs = {"P = 1": hogwild(problem, 1, 1, 0.5), "P = 2, no lock": hogwild(problem, 2, 1, 0.5),
        "P = 2, one lock": hogwild(problem, 2, 1, 0.5, lock=True)}
for name, out in runs.items():
    print(f"{name:>16}: {out['updates_per_second']:8.0f} updates/s, loss {out['loss']:.3f}, "
          f"conflicts {out['conflicts']} of {out['updates']} updates")
hogwild_speedup = runs["P = 2, no lock"]["updates_per_second"] / runs["P = 1"]["updates_per_second"]
print(f"speedup of two lock-free processes: {hogwild_speedup:.2f}x (wall clock, on a shared machine)")
assert runs["P = 1"]["conflicts"] == 0 and runs["P = 2, one lock"]["conflicts"] == 0
assert runs["P = 2, no lock"]["conflicts"] < 0.05 * runs["P = 2, no lock"]["updates"]     # sparse: rare
assert runs["P = 2, no lock"]["loss"] < 1.1 * runs["P = 1"]["loss"]                       # and harmless

# %% [markdown]
# ## 3. Sending fewer bits: 1-bit SGD, top-k and Deep Gradient Compression
#
# Four workers train the digits MLP (64-64-10, n = 4,810 parameters) with synchronous data parallelism
# for 8 epochs, global batch 32. Compressed messages cannot be summed on the way, so every worker
# sends its message to the others (an allgather) and each sums the decoded messages; the uncompressed
# baseline sends its float32 gradient the same way. Codecs (each a real uint8 message in the ledger):
#
# * **1-bit** (Seide et al.): a sign bit per entry, packed 8 per byte, plus two means per tensor;
# * **top-k 1%** (Lin et al.): the 49 largest entries as float32 values + int32 indices;
# * **DGC**: top-k of the *accumulated velocity* (momentum correction) with a density warm-up from 25%
#   to 1% over the first epoch, applied with plain SGD (its momentum lives in the compressor).
#
# *Error feedback* keeps what a message left out, c_t = g_t + r_{t−1}, r_t = c_t − decode(message), so
# Σ sent + r = Σ g: nothing is lost, only delayed. Without it the error is dropped every step.

# %%
EPOCHS, BATCH, CLR = 8, 32, 0.05


def compressed_run(comm, kind):
    model = mlp()
    n = sum(p.size for p in model.parameters())
    momentum = 0.9
    if kind == "none":
        compressor = None
    elif kind.startswith("1-bit"):
        compressor = ErrorFeedback(OneBit([p.shape for p in model.parameters()]), enabled="no EF" not in kind)
    elif kind.startswith("top-k"):
        compressor = ErrorFeedback(TopK(n, ratio=0.01), enabled="no EF" not in kind)
    else:
        compressor, momentum = DGC(n, 0.01, momentum=0.9, world_size=comm.world_size, warmup_steps=45), 0.0
    dp = CompressedDataParallel(comm, model, SGD(model.parameters(), lr=CLR, momentum=momentum),
                                CrossEntropyLoss(), compressor)
    rng = np.random.default_rng(1)
    for _ in range(EPOCHS):
        for idx in iterate_batches(len(DATA.y_train), BATCH, rng):
            dp.train_step(DATA.x_train[idx], DATA.y_train[idx])
    accuracy = float(np.mean(model.forward(DATA.x_test).argmax(axis=1) == DATA.y_test))
    return accuracy, float(np.mean(dp.bytes_per_step))


KINDS = ["none", "1-bit", "1-bit, no EF", "top-k 1%", "top-k 1%, no EF", "DGC 1%"]
results = {kind: run(compressed_run, 4, kind)[0] for kind in KINDS}
base_accuracy, base_bytes = results["none"]
print(f"{'':>16}  {'test accuracy':>13}  {'bytes sent per rank and step':>28}  {'fewer bytes':>11}")
for kind, (accuracy, nbytes) in results.items():
    print(f"{kind:>16}  {accuracy:13.3f}  {nbytes:28.0f}  {base_bytes / nbytes:10.1f}x")
assert results["1-bit"][0] >= base_accuracy - 0.01 and base_bytes / results["1-bit"][1] >= 25
assert results["top-k 1%"][0] >= base_accuracy - 0.01 and base_bytes / results["top-k 1%"][1] >= 30
assert results["1-bit, no EF"][0] < results["1-bit"][0] - 0.1          # without error feedback: visibly worse
assert results["top-k 1%, no EF"][0] < results["top-k 1%"][0]

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
colors = ["gray", "tab:blue", "lightsteelblue", "tab:orange", "moccasin", "tab:green"]
ax1.bar(KINDS, [results[k][1] for k in KINDS], color=colors)
ax1.set(yscale="log", ylabel="bytes sent per rank and step", title="the ledger, P = 4")
ax2.bar(KINDS, [results[k][0] for k in KINDS], color=colors)
ax2.set(ylim=(0.4, 1.0), ylabel="test accuracy", title=f"digits after {EPOCHS} epochs")
for ax in (ax1, ax2):
    ax.tick_params(axis="x", rotation=30)
fig.tight_layout()
fig.savefig(FIGURES / "11_compression.png", dpi=100)
plt.close(fig)

# %% [markdown]
# With error feedback, 1-bit SGD and top-k 1% reach the accuracy of uncompressed training after the
# same epochs with ~30× and ~49× fewer bytes per step; without it they lose accuracy (1-bit badly: the
# bias of a sign is never corrected). Against a *ring allreduce* of the dense gradient (2(P−1)/P·4n
# bytes per rank, lesson 05) the saving is P/2 times smaller, because dense chunks can be summed on the
# way and sparse ones cannot. DGC pays for its warm-up with denser messages in the first epoch.
#
# ## Exercises
#
# * `error_feedback` (minidist/parallel/compression/error_feedback.py): the residual of 1-bit SGD and DGC.
# * `stale_synchronous_bound` (minidist/parallel/asynchronous/staleness.py): when may a worker go on?
#
# Check them with `python -m pytest --exercise error_feedback --exercise stale_synchronous_bound`.
