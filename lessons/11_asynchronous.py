# %% [markdown]
# # 11 — Asynchronous and compressed SGD
#
# **Goal.** Synchronous data parallelism waits, at every step, for the slowest worker, and sends every
# bit of every gradient. This lesson trains without waiting (parameter servers, stale-synchronous
# bounds, local SGD, elastic averaging, Hogwild!) and without sending everything (1-bit SGD, top-k,
# Deep Gradient Compression), and measures both costs: staleness and lost accuracy.
#
# Sources: Catanzaro's "Scaling Deep Learning" talk ("Synchronous versus asynchronous SGD": parameter
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

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.cluster import run
from minidist.data import iterate_batches, load_digits
from minidist.nn import CrossEntropyLoss, Linear, MSELoss, Parameter, ReLU, Sequential
from minidist.optim import SGD
from minidist.parallel.asynchronous import (
    best_momentum,
    hogwild,
    implicit_momentum,
    least_squares,
    replay_parameter_server,
    sparse_problem,
    step_seconds,
    sweep_momentum,
    train_elastic,
    train_elastic_async,
    train_local_sgd,
    train_parameter_server,
)
from minidist.parallel.compression import DGC, CompressedDataParallel, ErrorFeedback, OneBit, TopK
from minidist.sim.plots import save_figure

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
# (`step_seconds(..., slowdown=[1, 1, 1, 3])`). The same table drives six trainers:
#
# * **synchronous** — the parameter server with staleness bound s = 0: nobody starts step k + 1 before
#   everybody pushed step k (the tests check that this *is* synchronous SGD, per parameter);
# * **asynchronous** — no bound: the server applies every push on arrival and replies at once;
# * **stale-synchronous**, s = 2 — a worker may run at most 2 steps ahead of the slowest;
# * **local SGD** — each worker steps alone, the models are averaged (allreduce) every H = 4 steps
#   (learning rate 4 × 0.05: an average of P models moves 1/P as far as the server's sum of P pushes);
# * **elastic averaging** — every τ = 4 steps each worker moves α = 0.2 towards the center variable x̃,
#   and x̃ moves towards the workers by β = 4α: x_r ← x_r − α(x_r − x̃), x̃ ← x̃ + α Σ_r (x_r − x̃);
# * **asynchronous elastic averaging** — the same, but x̃ lives on a center rank and every worker meets
#   it alone: after its τ = 4 steps worker i sends x_i, the center replies e = α(x_i − x̃) and sets
#   x̃ ← x̃ + e, the worker sets x_i ← x_i − e. Nobody waits for anybody but the center.

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
    if how == "elastic":
        return train_elastic(comm, model, optimizer, CrossEntropyLoss(), batch, seconds=SECONDS, every=4,
                             alpha=0.2)["centers"]
    out = train_elastic_async(comm, model, optimizer, CrossEntropyLoss(), batch, seconds=SECONDS,
                              every=4, alpha=0.2)
    return out["history"] if comm.rank == 0 else out["clock"]


servers = {name: run(server_run, WORKERS + 1, bound)[0]
           for name, bound in [("synchronous", 0), ("asynchronous", None), ("stale-synchronous s=2", 2)]}
curves = {name: [(t, train_loss(w)) for t, w in out["history"]] for name, out in servers.items()}
curves["local SGD, H=4"] = [(t, train_loss(w)) for t, w in run(periodic_run, WORKERS, "local")[0]]
curves["elastic averaging, tau=4"] = [(t, train_loss(w)) for t, w in run(periodic_run, WORKERS, "elastic")[0]]
center, *easgd_clocks = run(periodic_run, WORKERS + 1, "async elastic")
curves["asynchronous EASGD, tau=4"] = [(t, train_loss(w)) for t, w in center]

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
save_figure(fig, "11_stragglers.png", dpi=100)
plt.close(fig)
final = {name: curve[-1][1] for name, curve in curves.items()}
print("final training loss:", {name: round(float(v), 3) for name, v in final.items()})
assert curves["asynchronous"][-1][0] <= curves["synchronous"][-1][0]     # it never finishes later


def loss_at(curve, t):
    """The last recorded loss at or before simulated time t."""
    return [loss for s, loss in curve if s <= t][-1]


sync_end = curves["elastic averaging, tau=4"][-1][0]
early = {name: loss_at(curves[name], horizon)
         for name in ("asynchronous EASGD, tau=4", "elastic averaging, tau=4")}
print(f"asynchronous EASGD: the fast workers finish at {max(easgd_clocks[:3]) * 1e3:.0f} ms, the straggler "
      f"at {easgd_clocks[3] * 1e3:.0f} ms (synchronous EASGD: everybody at {sync_end * 1e3:.0f} ms); loss at "
      f"{horizon * 1e3:.0f} ms: {early['asynchronous EASGD, tau=4']:.3f} asynchronous, "
      f"{early['elastic averaging, tau=4']:.3f} synchronous")
assert max(easgd_clocks[:3]) < 0.5 * sync_end
assert early["asynchronous EASGD, tau=4"] < early["elastic averaging, tau=4"]

# %% [markdown]
# Synchronous SGD runs at the straggler's pace: every round lasts 3 ms. Asynchronous SGD lets the three
# fast workers go on, so the server applies ~2.5× as many pushes per simulated second (the fast workers
# finish their 48 steps after ~50 ms; from then on only the straggler pushes) — and pays in staleness:
# the fast workers' gradients are a few updates old, the straggler's up to ~10. The bound s
# trades between the two. Local SGD and elastic averaging communicate every 4 steps only, but wait for
# the straggler at each exchange; asynchronous EASGD does not: its fast workers are done in a third of
# the time, and at that moment its center is well ahead of synchronous EASGD's. Afterwards only the
# straggler meets the center, and pulls it back towards its own, older model: the elastic force works
# both ways. Per *update*, staleness costs something; per *second*, the curves show who wins here.
#
# ## 2. Asynchrony begets momentum
#
# What does staleness do to the optimisation? Mitliagkas, Zhang, Hadjis and Ré ("Asynchrony begets
# Momentum, with an Application to Deep Learning") model P asynchronous workers as a queue: step times
# are exponential, so each update comes from a random worker and its staleness S is geometric,
# P(S = l) = (1/P)(1 − 1/P)^l. Then, in expectation,
#
#     E[w_{t+1} − w_t] = (1 − 1/P) · E[w_t − w_{t−1}] − (lr/P) · E[∇f(w_t)]
#
# — heavy-ball momentum μ_implicit = 1 − 1/P, on top of any explicit momentum. Their advice (the
# slides' "pick momentum that minimizes number of iterations to same loss"): tune μ again for every
# degree of asynchrony; it falls as workers are added. We check it on an ill-conditioned least-squares
# problem (Hessian eigenvalues 2 … 0.02), where momentum matters: for P = 1, 2, 4, 8 workers with
# exponential step times and a budget of 240 updates in all, the parameter server runs with every μ of
# the slides' grid. ``replay_parameter_server`` is the one-process replay of the cluster's parameter
# server in the order ``ps_schedule`` gives (the tests check it against the cluster) — 40 runs in a second.

# %%
LS_X, LS_Y = least_squares(200, 20, 100.0, np.random.default_rng(0))
MOMENTA, BUDGET, LS_LR, PS = np.round(np.arange(0.0, 1.0, 0.1), 1), 240, 0.3, [1, 2, 4, 8]


def ls_model():
    return Linear(20, 1, bias=False, rng=np.random.default_rng(1), dtype=np.float64)


def ls_batch(worker, step):
    return LS_X, LS_Y                      # the full gradient: no sampling noise, only staleness


def ls_loss(flat):
    return float(np.mean((LS_X @ flat[:, None] - LS_Y) ** 2))


def queue_seconds(p):
    return np.random.default_rng(p).exponential(1e-3, size=(p, BUDGET // p))


sweep = sweep_momentum(ls_model, MSELoss(), ls_batch, ls_loss, lr=LS_LR, momenta=MOMENTA,
                       seconds_for=queue_seconds, workers=PS)
best = best_momentum(sweep, MOMENTA)
stale = {p: replay_parameter_server(ls_model(), MSELoss(), ls_batch, lr=LS_LR, seconds=queue_seconds(p),
                                    record_every=1) for p in PS}
print(f"{'P':>3}  {'best explicit mu':>16}  {'implicit 1-1/P':>14}  {'mu*_1 - (1-1/P)':>15}  "
      f"{'mean staleness':>14}")
for p, mu in zip(PS, best):
    print(f"{p:>3}  {mu:16.1f}  {implicit_momentum(p):14.3f}  "
          f"{max(0.0, best[0] - implicit_momentum(p)):15.3f}  "
          f"{np.mean(stale[p]['staleness']):14.2f}")
assert np.all(np.diff(best) <= 0) and best[-1] < best[0]        # the best explicit momentum falls with P
assert best[-1] <= best[0] - 0.5                                 # by a lot at P = 8
assert all(np.mean(stale[p]["staleness"]) >= 0.8 * (p - 1) for p in PS)   # the queue's mean P − 1, nearly
# the momentum best for one worker, used by eight: the loss ends above where it started (or overflows)
start = ls_loss(np.concatenate([p.data.ravel() for p in ls_model().parameters()]))
eight_at_best_one = sweep[list(PS).index(8)][list(MOMENTA).index(best[0])]
print(f"P = 8 at mu = {best[0]}: loss {eight_at_best_one:.3g} after {BUDGET} updates (start {start:.3g})")
assert not eight_at_best_one < start

# the expected trajectory: asynchronous SGD with P = 4 and no momentum against heavy ball, SGD(lr/P, 1 − 1/P)
w = Parameter(np.concatenate([p.data.ravel() for p in ls_model().parameters()]))
heavy_ball, hb_curve = SGD([w], lr=LS_LR / 4, momentum=implicit_momentum(4)), [ls_loss(w.data)]
for _ in range(BUDGET):
    w.grad[...] = (2 / len(LS_Y)) * (LS_X.T @ (LS_X @ w.data[:, None] - LS_Y)).ravel()
    heavy_ball.step()
    hb_curve.append(ls_loss(w.data))
async_curve = [ls_loss(v) for _, v in stale[4]["history"]]
print(f"after {BUDGET} updates, P = 4, mu = 0: asynchronous {async_curve[-1]:.2e}, heavy ball with mu = 0.75 "
      f"and lr/4 {hb_curve[-1]:.2e}")
assert 0.75 < async_curve[-1] / hb_curve[-1] < 1.33

fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
for i, p in enumerate(PS):
    ax1.plot(MOMENTA, np.minimum(sweep[i], 1e3), "o-", label=f"P = {p}")
    ax1.plot(best[i], sweep[i].min(), "k*", markersize=12)
ax1.set(yscale="log", xlabel="explicit momentum mu", ylabel=f"loss after {BUDGET} updates",
        title="the best momentum (*) falls as workers are added")
ax1.legend(fontsize="small")
levels = np.arange(30)
counts = np.bincount(stale[8]["staleness"], minlength=30)[:30]
ax2.bar(levels, counts / len(stale[8]["staleness"]), color="lightsteelblue", label="simulated, P = 8")
ax2.plot(levels, (1 / 8) * (7 / 8) ** levels, "k.-", label="geometric (1/P)(1-1/P)^l")
ax2.set(xlabel="staleness l", ylabel="fraction of updates", title="staleness under exponential step times")
ax2.legend(fontsize="small")
ax3.plot(async_curve, label="asynchronous, P = 4, mu = 0")
ax3.plot(hb_curve, "--", label="one worker, mu = 1 - 1/4, lr/4")
ax3.set(yscale="log", xlabel="updates", ylabel="loss", title="staleness acts as momentum")
ax3.legend(fontsize="small")
fig.tight_layout()
save_figure(fig, "11_momentum.png", dpi=100)
plt.close(fig)

# %% [markdown]
# The best explicit momentum falls from 0.9 with one worker as P grows, and a momentum that is best for
# one worker makes eight diverge. The additive rule μ*_P ≈ μ*_1 − (1 − 1/P) predicts the direction but
# overshoots: the two momenta do not simply add (with stale gradients the update is a higher-order
# recursion), and the grid's 0.9 cap hides how large μ*_1 would like to be. Without explicit momentum, the
# asynchronous run and heavy ball with μ = 1 − 1/P and lr/P follow each other, as the theorem says.
#
# ## 3. Hogwild!: no lock at all, on shared memory
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
# ## 4. Sending fewer bits: 1-bit SGD, top-k and Deep Gradient Compression
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
# the baseline sends every rank's dense gradient to every other rank: (P − 1)·4n bytes, P/2 times a ring's
# 2(P − 1)/P·4n (lesson 05); DGC's warm-up (denser messages first) costs bytes over plain top-k 1%
n_params, P = sum(p.size for p in mlp().parameters()), 4
ring_bytes = 2 * (P - 1) / P * 4 * n_params
assert base_bytes == (P - 1) * 4 * n_params and base_bytes / ring_bytes == P / 2
assert results["DGC 1%"][1] > results["top-k 1%"][1] and results["DGC 1%"][0] >= base_accuracy - 0.02

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
colors = ["gray", "tab:blue", "lightsteelblue", "tab:orange", "moccasin", "tab:green"]
ax1.bar(KINDS, [results[k][1] for k in KINDS], color=colors)
ax1.set(yscale="log", ylabel="bytes sent per rank and step", title="the ledger, P = 4")
ax2.bar(KINDS, [results[k][0] for k in KINDS], color=colors)
ax2.set(ylim=(0.0, 1.0), ylabel="test accuracy", title=f"digits after {EPOCHS} epochs")
for ax in (ax1, ax2):
    ax.tick_params(axis="x", rotation=30)
fig.tight_layout()
save_figure(fig, "11_compression.png", dpi=100)
plt.close(fig)

# %% [markdown]
# With error feedback, 1-bit SGD and top-k 1% reach the accuracy of uncompressed training after the
# same epochs with the reductions in the last column above; without it they lose accuracy (1-bit badly: the
# bias of a sign is never corrected). Against a *ring allreduce* of the dense gradient (2(P−1)/P·4n
# bytes per rank, lesson 05) the saving is P/2 times smaller, because dense chunks can be summed on the
# way and sparse ones cannot. DGC pays for its warm-up with denser messages in the first epoch.
#
# ## Exercises
#
# * `error_feedback` (minidist/parallel/compression/error_feedback.py): the residual of 1-bit SGD and DGC.
# * `stale_synchronous_bound` (minidist/parallel/asynchronous/schedule.py): when may a worker go on?
#
# Check them with `python -m pytest --exercise error_feedback --exercise stale_synchronous_bound`.
