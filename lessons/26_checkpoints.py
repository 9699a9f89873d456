# %% [markdown]
# # 26 — Checkpoints: snapshots, rollback, and how often to take them
#
# **Goal.** The "Hardware Accelerators for Training Deep Neural Networks" tutorial lists, among the pros
# of synchronous data parallelism, that "fault tolerance is practically handled by snapshots and rollback
# otherwise". Every large run does exactly that: it saves its state every so often, and when an
# accelerator dies the run ends, restarts, and rolls back to the last snapshot. We measure the three
# things that decide whether that works and what it costs:
#
# 1. **What each rank saves**, and how many bytes, for each way of splitting the model (ZeRO stages,
#    tensor and pipeline splits) — `minidist.checkpoint.save`, one file per rank and a manifest.
# 2. **What a checkpoint costs** on the simulated clock, and the interval that minimises the expected
#    lost work for a failure rate: Young's τ* = √(2·C·MTBF) (Daly: τ* ≈ √(2·C·MTBF) − C), checked
#    against a simulated sweep of intervals.
# 3. **A run killed and resumed** (`minidist.checkpoint.run_resilient`): a rank SIGKILLed mid-run, the
#    run restarted from the last complete checkpoint, and the finished weights bitwise those of a run
#    that was never interrupted.
#
# How a checkpoint is laid out (minidist/checkpoint/): every element of the unsplit model has a *label*,
# its index in the concatenation of `model.named_parameters()` — the same labels `full_state_dict` uses.
# Rank r writes, for each parameter its optimizer steps (its tensor slices, its pipeline stage, or under
# ZeRO its shard of the flat groups), the labels, the values and the optimizer's state of those
# elements. Loading scatters every file into the full vectors and each new rank takes *its* labels: the
# same mesh gets back the same bits, another mesh gets its own split — a re-split, exact.

# %%
import math
import os
import signal
import tempfile
from pathlib import Path

import matplotlib
import matplotlib.ticker
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from minidist.checkpoint import read_manifest, resume, run_resilient, save
from minidist.checkpoint.shards import rank_arrays
from minidist.cluster import run
from minidist.nn import GPT, CrossEntropyLoss
from minidist.optim import AdamW
from minidist.parallel import Mesh, parallelize
from minidist.sim.plots import save_figure

V, T, N = 32, 16, 8
DISK = 2e9            # bytes/s each rank writes to its local disk (an NVMe drive's order of magnitude)


def build():
    return GPT(V, T, 4, 32, 4, rng=np.random.default_rng(0), dtype=np.float64)


def trainer_on(comm, sizes, zero=0):
    extra = {"schedule": "1f1b", "micro_batches": 2} if sizes.get("pipeline", 1) > 1 else {}
    return parallelize(build(), Mesh(comm, **sizes), loss_fn=CrossEntropyLoss(),
                       optimizer=lambda ps: AdamW(ps, lr=1e-2), zero=zero, **extra)


def draw(rng):
    return rng.integers(0, V, size=(N, T)), rng.integers(0, V, size=(N, T))


ELEMENTS = sum(p.size for p in build().parameters())
print(f"the model: a GPT of {ELEMENTS:,} float64 parameters, AdamW (2 state arrays per parameter)")

# %% [markdown]
# ## 1. What each rank saves
#
# On 4 ranks, for each layout: one training step, a checkpoint, and the manifest's record of each rank's
# file. A rank's file holds, per element it steps, 4 numbers of 8 bytes: its label, its value and AdamW's
# two moments (exp_avg, exp_avg_sq) — 32 bytes per element (the payload), plus the .npz headers (four
# arrays per parameter, a few hundred bytes each). We also time the save on the simulated clock,
# charging each rank's write at DISK bytes/s (the slowest rank's bytes in the table).

# %%
LAYOUTS = [("data 4", {"data": 4}, 0), ("data 4, ZeRO-1", {"data": 4}, 1),
           ("data 4, ZeRO-2", {"data": 4}, 2), ("data 4, ZeRO-3", {"data": 4}, 3),
           ("data 2 × tensor 2", {"data": 2, "tensor": 2}, 0),
           ("tensor 2 × pipeline 2", {"tensor": 2, "pipeline": 2}, 0), ("pipeline 4", {"pipeline": 4}, 0)]


def save_each_layout(comm, root):
    out = []
    for k, (_, sizes, zero) in enumerate(LAYOUTS):
        trainer, rng = trainer_on(comm, sizes, zero), np.random.default_rng(1)
        start = comm.clock
        trainer.train_step(*draw(rng))
        step_seconds, start = comm.clock - start, comm.clock
        save(trainer, f"{root}/{k}", 1, rngs={"batches": rng}, disk_bytes_per_second=DISK)
        elements = sum(p.size for p in trainer.optimizer.params)
        payload = sum(a.nbytes for a in rank_arrays(trainer).values())     # what the file's arrays hold
        out.append((elements, step_seconds, comm.clock - start, payload))
    return out


with tempfile.TemporaryDirectory() as root:
    measured = run(save_each_layout, 4, root, timeout=240)
    files = [read_manifest(Path(root) / str(k) / "step-00000001")["files"] for k in range(len(LAYOUTS))]

print(f"{'layout':<24}{'elements per rank':>30}{'payload (B)':>13}{'file (B)':>11}{'save (ms)':>11}")
cost = {}
for k, (name, sizes, zero) in enumerate(LAYOUTS):
    elements = [measured[r][k][0] for r in range(4)]
    sizes_on_disk = [f["bytes"] for f in files[k].values()]
    seconds = max(measured[r][k][2] for r in range(4))
    cost[name] = (seconds, max(measured[r][k][1] for r in range(4)), max(sizes_on_disk))
    payload = [measured[r][k][3] for r in range(4)]
    print(f"{name:<24}{str(elements):>30}{max(payload):>13,}{max(sizes_on_disk):>11,}{1e3 * seconds:>11.3f}")
    for n, p, b in zip(elements, payload, sizes_on_disk):
        assert p == 32 * n and p < b < 1.2 * p, (name, n, p, b)   # 32 bytes an element; then headers
    if sizes == {"data": 4}:
        # without ZeRO every rank saves the whole model; with any stage, its 1/4 of every flat group
        assert elements == [ELEMENTS] * 4 if zero == 0 else sum(elements) == ELEMENTS
    if zero == 0 and sizes != {"data": 4}:           # a tensor or pipeline split: a part each, all of it
        assert max(elements) < ELEMENTS <= sum(elements)
    if sizes == {"pipeline": 4}:
        assert sum(elements) == ELEMENTS               # the stages cut the model: nothing held twice
    # the save costs each rank's write at DISK bytes/s, plus three barriers' messages
    assert max(sizes_on_disk) / DISK <= seconds < max(sizes_on_disk) / DISK + 1e-3

assert cost["data 4, ZeRO-1"][0] < 0.3 * cost["data 4"][0]
step_seconds = cost["data 4"][1]
print(f"\none training step of data 4 takes {1e3 * step_seconds:.3f} ms on the simulated clock: a checkpoint "
      f"costs {cost['data 4'][0] / step_seconds:.2f} steps without ZeRO, "
      f"{cost['data 4, ZeRO-1'][0] / step_seconds:.2f} with ZeRO-1")
print(f"ZeRO's partitions write in parallel: a checkpoint of data 4 with ZeRO-1 costs "
      f"{cost['data 4, ZeRO-1'][0] / cost['data 4'][0]:.2f} of one without (each rank writes a quarter).")

# %% [markdown]
# Two things to see. Under ZeRO (any stage) the checkpoint is sharded like the optimizer: the 4 files
# hold the model once between them, so the slowest rank writes a quarter of the bytes; ZeRO-1, 2 and 3
# save the same files (their partitions differ in memory, not in what must survive). Without ZeRO every
# data-parallel replica writes the same copy — real systems let one replica write; here each rank's file
# stays self-contained, which is what lets a restart lose *any* rank. A tensor or pipeline split gives
# each rank its part: the pipeline's stages cut the model (the first holds the embeddings, so the parts
# are unequal), while the embeddings, `ln_f` and the head stay whole on every tensor rank.

# %% [markdown]
# ## 2. How often: Young and Daly
#
# Let a checkpoint cost C seconds, failures arrive at random (a Poisson process) with mean time between
# failures M, and a failure lose everything since the last checkpoint. With a checkpoint every τ seconds
# of work, the expected wasted fraction is about
#
#     waste(τ) ≈ C/τ  (writing checkpoints)  +  τ/(2M)  (half an interval redone per failure),
#
# smallest at **τ* = √(2·C·M)** (Young, 1974). Exactly, with failures striking during the checkpoint too,
# the expected wall time of one interval is E(τ) = M·(e^{(τ+C)/M} − 1) (Daly, 2006, whose first-order
# optimum is τ* ≈ √(2CM) − C). We take C from the simulated clock — the data-4 ZeRO-1 save above — and an
# MTBF of 20,000 checkpoints' worth (the ratio of a one-minute checkpoint to a fortnight between
# failures), then simulate: a job of many intervals, exponential failure times,
# each failed interval retried from its start.

# %%
C = cost["data 4, ZeRO-1"][0]
MTBF = 20_000 * C
young = math.sqrt(2 * C * MTBF)
daly = young - C
taus = young * np.geomspace(1 / 8, 8, 25)


def exact_overhead(tau):
    return MTBF * np.expm1((tau + C) / MTBF) / tau - 1


def simulated_overhead(tau, rng, intervals=40_000):
    """Wall time / useful work − 1 for ``intervals`` intervals of tau work + C checkpoint each."""
    wall, pending = 0.0, np.ones(intervals, dtype=bool)
    while pending.any():
        failure = rng.exponential(MTBF, size=int(pending.sum()))
        done = failure >= tau + C
        wall += done.sum() * (tau + C) + failure[~done].sum()     # a failure loses the attempt so far
        pending[np.flatnonzero(pending)[done]] = False
    return wall / (intervals * tau) - 1


rng = np.random.default_rng(26)
simulated = np.array([simulated_overhead(tau, rng) for tau in taus])
best = taus[np.argmin(simulated)]
exact_best = taus[np.argmin(exact_overhead(taus))]
print(f"C = {1e3 * C:.3f} ms, MTBF = {MTBF:.2f} s: Young's τ* = √(2·C·MTBF) = {young:.3f} s "
      f"(Daly: {daly:.3f} s), a checkpoint every {young / step_seconds:.0f} steps of data 4")
print(f"simulated sweep: the best of {len(taus)} intervals is τ = {best:.3f} s "
      f"(overhead {100 * simulated.min():.2f}%); at Young's τ*: {100 * exact_overhead(young):.2f}% "
      f"expected")
for factor in (1 / 8, 1 / 2, 2, 8):
    k = int(np.argmin(abs(taus - factor * young)))
    print(f"  τ = {factor:>5.3g} τ*: simulated overhead {100 * simulated[k]:6.2f}%, "
          f"first order C/τ + τ/2M = {100 * (C / taus[k] + taus[k] / (2 * MTBF)):6.2f}%")
assert young / 1.5 < best < young * 1.5 and exact_best == taus[np.argmin(abs(taus - young))]
assert simulated[np.argmin(abs(taus - young))] < simulated.min() * 1.05     # within 5% of the best
assert simulated[0] > 3 * simulated.min() and simulated[-1] > 3 * simulated.min()  # both ends cost

fig, ax = plt.subplots(figsize=(7, 4.2))
ax.plot(taus, 100 * exact_overhead(taus), color="C0", label="expected: M·(exp((τ+C)/M) − 1)/τ − 1")
ax.plot(taus, 100 * (C / taus + taus / (2 * MTBF)), color="C1", ls="--", label="first order: C/τ + τ/2M")
ax.plot(taus, 100 * simulated, "o", color="C2", ms=4, label="simulated failures (40,000 intervals)")
ax.axvline(young, color="grey", ls=":", label=f"Young: τ* = √(2·C·MTBF) = {young:.2f} s")
ax.set(xscale="log", yscale="log", xlabel="checkpoint interval τ (s of work)",
       ylabel="time lost (% of the work)", title=f"C = {1e3 * C:.2f} ms, MTBF = {MTBF:.0f} s")
ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
ax.legend(fontsize=8)
fig.tight_layout()
save_figure(fig, "26_checkpoints.png")

# %% [markdown]
# Checkpointing too often pays C over and over (the left of the figure); too rarely redoes long stretches
# after each failure (the right); the square root balances them, and the simulated failures agree. As a
# cluster grows its MTBF shrinks (N accelerators fail N times as often) and τ* with √MTBF, while sharded
# checkpoints (ZeRO) keep C from growing with the model: that is why large runs save sharded, often.

# %% [markdown]
# ## 3. A run killed and resumed
#
# 6 steps of data 2 × tensor 2, a checkpoint every 2 steps. Before its 4th step rank 1 is killed with
# SIGKILL (no exception, no clean-up: the process is gone). `run_resilient` sees the cluster run end
# with its ClusterError, starts it again, and the training function resumes from the newest complete
# checkpoint — weights, AdamW's moments and step count, and the batch generator's state.

# %%
STEPS, EVERY = 6, 2


def training(comm, root, marker):
    rng = np.random.default_rng(7)
    trainer = trainer_on(comm, {"data": 2, "tensor": 2})
    for step in range(resume(trainer, root, rngs={"batches": rng}), STEPS):
        if marker and step == 3 and comm.rank == 1 and not os.path.exists(marker):
            Path(marker).touch()                      # once: the restarted rank 1 goes on
            os.kill(os.getpid(), signal.SIGKILL)
        trainer.train_step(*draw(rng))
        if (step + 1) % EVERY == 0:
            save(trainer, root, step + 1, rngs={"batches": rng})
    return trainer.full_state_dict()


with tempfile.TemporaryDirectory() as root:
    never_killed = run_resilient(training, 4, f"{root}/a", None, root=f"{root}/a", restarts=0, timeout=240)
    killed = run_resilient(training, 4, f"{root}/b", f"{root}/marker", root=f"{root}/b", restarts=2,
                           timeout=240)
print(killed.report())
assert len(killed.failures) == 1 and "rank 1" in killed.failures[0].error
assert killed.failures[0].resumed_from == 2
for name, value in never_killed.results[0].items():
    for state in killed.results:
        assert np.array_equal(state[name], value), name
print(f"after {STEPS} steps the killed-and-resumed run's {len(never_killed.results[0])} tensors are "
      "bitwise those of the run that was never interrupted; killed before its 4th step and resumed from "
      "the checkpoint after its 2nd, it redid 1 step")

# %% [markdown]
# **What to remember.** A checkpoint is each rank's own elements plus a manifest, written to a temporary
# directory and renamed into place only when every file is on disk and checksummed — so a crash mid-save
# leaves the previous snapshot the newest. Rollback is then exact: same mesh, same bits; another mesh,
# the labels re-split it. And the interval is a trade-off with a closed form, τ* = √(2·C·MTBF).
