# %% [markdown]
# # 08 — Pipeline parallelism: micro-batches, the bubble, 1F1B, activation memory and checkpointing
#
# **Goal.** Cut a model into P stages on P (simulated) accelerators and train it with only point-to-point
# messages between neighbours. See why the naive pipeline leaves most devices idle, how GPipe's
# micro-batches shrink that idle time — the *bubble* — to (P−1)/(M+P−1), what that costs in activation
# memory, how the 1F1B schedule keeps GPipe's bubble with far less memory, what gradient checkpointing
# trades, what uneven stages cost, and what PipeDream's way of removing the bubble entirely costs (stale
# weights, a learning rate to retune).
#
# Source: slides "Distributed Deep Learning (Part II)" ("Pipeline parallelism ... No collective, only P2P ...
# Bubbles in pipeline ... Removing bubbles leads to stale weights"; "GPipe: Reduce Bubble with
# Micro-Batching ... Con: Significantly increases activation memory"; "PipeDream: Use Async Updates to
# remove Bubble"), the slides "Scaling Up Training" ("split mini-batch into sequential
# micro-batches", "Gradient Checkpointing"), the tutorial "Hardware Accelerators for Training DNNs" ("25% More
# Compute Saves 80% memory") and the HOT CHIPS tutorial write-up (load balance).
#
# Everything below is a real run: every stage is an OS process (minidist.cluster), activations and
# gradients travel as messages, and every rank's gradients are checked against one-process training in
# tests/parallel/test_parallel_pipeline_train.py. Time is the cluster's *simulated* clock: each layer's
# FLOPs are charged at the device's rate and each message costs α + nβ.
#
# Exercise: `gpipe_schedule` (minidist/parallel/pipeline/schedule.py) — build GPipe's schedule tick by
# tick; `python -m pytest --exercise gpipe_schedule`.

# %%
import itertools
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.cluster import Device, LinkModel, run, run_traced
from minidist.nn import Linear, MSELoss, ReLU, Sequential, Tanh
from minidist.nn.checkpoint import Checkpoint, forward_saving
from minidist.optim import SGD
from minidist.parallel.pipeline import Pipeline, format_schedule, make_schedule, max_in_flight
from minidist.parallel.pipeline.boundaries import layer_costs, split_by_layers, stage_costs
from minidist.parallel.pipeline.pipedream import train_in_one_process
from minidist.parallel.pipeline.schedule import bubble_fraction
from minidist.parallel.pipeline.weight_stash import train_on_stream
from minidist.sim.plots import figures_dir, save_figure
from minidist_course.questions import check_yourself

FIGURES = figures_dir()  # figures/, or $MINIDIST_FIGURES (the tests use a temporary folder)
START = time.perf_counter()

# The simulated machine: NVLink-like links (α = 5 µs, 25 GB/s) and a 100 GFLOP/s device — slow on
# purpose, so that computing a stage takes much longer than sending its activations, as it does for the
# large models pipelines are used for. (Lesson 04 shows the clock and the link model.)
LINK, DEVICE = LinkModel(), Device(flops=1e11)
P, WIDTH, BATCH = 4, 512, 128


def mlp(widths: list[int], seed: int = 0, act=ReLU, dtype=np.float32) -> Sequential:
    """Linear + ReLU (or act) blocks through the given widths (the last Linear has no activation)."""
    rng, layers = np.random.default_rng(seed), []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(Linear(a, b, rng=rng, dtype=dtype))
        if i < len(widths) - 2:
            layers.append(act())
    return Sequential(*layers)


def train_once(comm, widths, schedule, M, checkpoint=False, boundaries="layers"):
    """One pipelined SGD step on a fixed batch; returns what this stage measured."""
    data = np.random.default_rng(1)
    x = data.normal(size=(BATCH, widths[0])).astype(np.float32)
    target = data.normal(size=(BATCH, widths[-1])).astype(np.float32)
    pipe = Pipeline(comm, mlp(widths), loss_fn=MSELoss(), num_micro_batches=M, schedule=schedule,
                    checkpoint=checkpoint, boundaries=boundaries, sample=x)
    pipe.train_step(x, target, SGD(pipe.parameters(), lr=0.01))
    return {"busy": pipe.busy_seconds, "end": comm.clock, "memory": pipe.memory.timeline,
            "peak": pipe.peak_activation_bytes, "boundaries": pipe.boundaries}


def pipeline_run(schedule, M, widths=None, checkpoint=False, boundaries="layers"):
    widths = widths or [WIDTH] * (2 * P + 1)  # 2P Linear layers: two per stage
    results, trace = run_traced(train_once, P, widths, schedule, M, checkpoint, boundaries,
                                link=LINK, device=DEVICE, timeout=120)
    makespan = max(r["end"] for r in results)
    bubble = 1 - sum(r["busy"] for r in results) / (P * makespan)
    return results, trace, makespan, bubble


def draw_ops(ax, trace, title, axis_span=None):
    """One row per stage; a bar per F/B op (the layers' compute spans of one op merged), idle is white.
    axis_span: the seconds the (shared) x-axis covers, if longer than this trace."""
    ops = {}
    for span in trace.spans:
        if span.kind == "compute" and span.label[:1] in "FB":
            key = (span.rank, span.label)
            start, end = ops.get(key, (span.start, span.end))
            ops[key] = (min(start, span.start), max(end, span.end))
    cmap = plt.get_cmap("tab10")
    for (rank, label), (start, end) in ops.items():
        m = int(label[1:])
        ax.barh(rank, (end - start) * 1e3, left=start * 1e3, height=0.7, edgecolor="black", linewidth=0.4,
                color=cmap(m % 10), alpha=1.0 if label[0] == "F" else 0.55,
                hatch=None if label[0] == "F" else "//")
        if end - start > 0.02 * (axis_span or max(e for _, e in ops.values())):   # room for its label
            ax.text((start + end) / 2 * 1e3, rank, label, ha="center", va="center", fontsize=7)
    ax.set_yticks(range(P), [f"stage {s}" for s in range(P)]), ax.invert_yaxis()
    ax.set_xlabel("simulated time (ms)"), ax.set_title(title, fontsize=10)


# %% [markdown]
# ## 1. Schedules are data
#
# A schedule lists, tick by tick, which stage runs the forward (F) or backward (B) of which micro-batch.
# The executor on rank s simply runs row s in order; sends and receives make each stage wait for its
# inputs. Printing one is the quickest way to see the bubble — the dots:

# %%
for name in ("naive", "gpipe", "1f1b"):
    M = 1 if name == "naive" else 4
    print(f"{name}, P = {P}, M = {M}:")
    print(format_schedule(make_schedule(name, P, M), P), "\n")

# %% [markdown]
# ## 2. The naive pipeline: one device busy at a time
#
# Stage s needs stage s−1's output before it can start, and the backward pass runs the chain in
# reverse. With the whole batch as one piece, only one stage works at any moment: each device is idle a
# fraction (P−1)/P of the step, and P devices finish the step no sooner than one would have (plus the
# messages). That is the "bubble" of the Part II slides' pipeline slide.

# %%
naive_results, naive_trace, naive_time, naive_bubble = pipeline_run("naive", 1)
print(f"naive pipeline, P = {P}: step {naive_time * 1e3:.2f} ms, idle fraction {naive_bubble:.3f} "
      f"(formula (P−1)/P = {(P - 1) / P:.3f}; the excess is the messages)")
assert abs(naive_bubble - (P - 1) / P) < 0.02

# %% [markdown]
# ## 3. GPipe: micro-batches shrink the bubble
#
# GPipe splits the batch of N samples into M micro-batches and pipelines them: all forwards, then all
# backwards. If F and B of one micro-batch take t_F and t_B on every stage, the step takes
# (M + P − 1)(t_F + t_B), of which each stage computes M(t_F + t_B), so
#
#     bubble = (P − 1) / (M + P − 1).
#
# Gradients of the micro-batches are *added* (backward accumulates into Parameter.grad), each scaled by
# n_m / N so that the sum is exactly the full batch's gradient even when N does not divide by M, and the
# optimizer steps once per batch — the result is the same training as on one device. The timelines
# below are drawn from the cluster's trace of each run (coloured by micro-batch; B hatched):

# %%
fig, axes = plt.subplots(3, 1, figsize=(10, 7.5), sharex=True)
gpipe = {}
for ax, M in zip(axes, (1, 4, 8)):
    results, trace, makespan, bubble = pipeline_run("gpipe", M)
    gpipe[M] = (results, makespan, bubble, trace)
    draw_ops(ax, trace, f"GPipe, P = {P}, M = {M}: step {makespan * 1e3:.2f} ms, bubble {bubble:.1%} "
                        f"(formula {(P - 1) / (M + P - 1):.1%})", axis_span=gpipe[1][1])
fig.tight_layout()
save_figure(fig, "08_gpipe_timelines.png", dpi=110)
plt.close(fig)

print(" M   measured bubble   (P−1)/(M+P−1)   step (ms)")
for M, (_, makespan, bubble, _) in gpipe.items():
    formula = (P - 1) / (M + P - 1)
    print(f"{M:2d}   {bubble:15.4f}   {formula:13.4f}   {makespan * 1e3:9.3f}")
    assert abs(bubble - formula) < 0.02, "the measured bubble follows the formula (messages add a little)"
assert gpipe[8][1] < gpipe[4][1] < gpipe[1][1]

# %% [markdown]
# The small excess over the formula is communication: each F and B also sends an activation (or its
# gradient) to the neighbour, and the clock charges α + nβ for it. The tests run the same with free links
# and get the formula to 1e-9.
#
# ## 4. The price: activation memory — and 1F1B
#
# Between F(s, m) and B(s, m) stage s keeps micro-batch m's activations (every Linear's input, every
# ReLU's mask). GPipe runs all M forwards first, so at its peak *every* stage holds all M micro-batches —
# the whole batch's activations, as without micro-batches ("Significantly increases activation memory"
# compared with what one micro-batch needs). The 1F1B schedule (PipeDream-flush) starts the backward of
# micro-batch 0 as soon as the last stage has done its forward, and from then on alternates one forward,
# one backward: stage s never holds more than P − s micro-batches, the same bubble, and memory that no
# longer grows with M. (The last stage also keeps dLoss/dy of each micro-batch until its backward; under
# 1F1B it frees everything between micro-batches: the brief drops to zero.)

# %%
M, gpipe_results = 8, gpipe[8][0]
f1b_results, f1b_trace, f1b_time, f1b_bubble = pipeline_run("1f1b", M)
held = max_in_flight(make_schedule("1f1b", P, M), P)
print(f"1F1B, M = {M}: step {f1b_time * 1e3:.2f} ms (GPipe {gpipe[M][1] * 1e3:.2f} ms), "
      f"bubble {f1b_bubble:.4f}")
print("stage   GPipe peak (KiB)   1F1B peak (KiB)   micro-batches held by 1F1B")
for s in range(P):
    g, f = gpipe_results[s]["peak"], f1b_results[s]["peak"]
    print(f"{s:5d}   {g / 1024:16.0f}   {f / 1024:15.0f}   {held[s]} = P − s")
    assert f * M == g * held[s], "equal micro-batches: peak memory is proportional to micro-batches held"
assert abs(f1b_bubble - gpipe[M][2]) < 1e-3

fig, axes = plt.subplots(2, 2, figsize=(12, 6), gridspec_kw={"width_ratios": [1.4, 1]})
draw_ops(axes[0, 0], f1b_trace, f"1F1B, P = {P}, M = {M}: bubble {f1b_bubble:.1%}")
draw_ops(axes[1, 0], gpipe[M][3], f"GPipe, P = {P}, M = {M}: bubble {gpipe[M][2]:.1%}")
for ax, name, res in ((axes[0, 1], "1F1B", f1b_results), (axes[1, 1], "GPipe", gpipe_results)):
    for s in range(P):
        times, _, held = zip(*res[s]["memory"])          # the ledger's (seconds, label, {category: bytes})
        ax.step(np.array(times) * 1e3, np.array([h["activations"] for h in held]) / 1024, where="post",
                lw=1.4, label=f"stage {s}: peak {res[s]['peak'] / 1024:.0f} KiB")
    ax.set_title(f"{name}: activation memory held per stage", fontsize=10)
    ax.set(xlabel="simulated time (ms)", ylabel="KiB")
    ax.legend(fontsize=7, loc="upper right")
axes[0, 1].sharey(axes[1, 1])
fig.tight_layout()
save_figure(fig, "08_1f1b_vs_gpipe_memory.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ## 5. Gradient checkpointing: memory for compute
#
# `Checkpoint(segment)` keeps only the segment's input during forward and recomputes the segment's
# activations during backward (same input, same weights, same random draws: bitwise the same
# gradients). With checkpointing on every stage, a stage holds one input per micro-batch in flight plus,
# during one backward, one micro-batch's recomputed activations. The recompute is one more forward: with
# backward ≈ 2× forward, compute goes from 3F to 4F, **+33%**.

# %%
ckpt_results, _, ckpt_time, _ = pipeline_run("gpipe", M, checkpoint=True)
plain_peak, ckpt_peak = (max(r["peak"] for r in rs) for rs in (gpipe_results, ckpt_results))
extra_compute = sum(r["busy"] for r in ckpt_results) / sum(r["busy"] for r in gpipe_results) - 1
print(f"GPipe, M = {M}, two Linear+ReLU per stage: peak activations {plain_peak / 2**20:.2f} MiB -> "
      f"{ckpt_peak / 2**20:.2f} MiB with checkpointing ({1 - ckpt_peak / plain_peak:.0%} saved), "
      f"compute +{extra_compute:.0%}, step {gpipe[M][1] * 1e3:.2f} -> {ckpt_time * 1e3:.2f} ms")
assert abs(extra_compute - 1 / 3) < 1e-9

# %% [markdown]
# How much is saved depends on how much a segment holds relative to its input. In one process, a
# 24-layer MLP (12 Linear+ReLU blocks) checkpointed in segments of k blocks keeps 12/k segment inputs
# and, while recomputing one segment, k blocks' activations: the total is smallest near k ≈ √12
# (Chen et al.'s √n schedule), and the compute added is one forward whatever k is.

# %%
def checkpointed_mlp_memory(blocks_per_segment: int, blocks: int = 12, width: int = 256, batch: int = 64):
    layers = list(mlp([width] * (blocks + 1)).layers) + [ReLU()]
    per_segment = 2 * blocks_per_segment
    model = Sequential(*[Checkpoint(Sequential(*layers[i:i + per_segment]))
                         for i in range(0, len(layers), per_segment)])
    x = np.random.default_rng(0).normal(size=(batch, width)).astype(np.float32)
    y, saved = forward_saving(model, x)
    held = saved.nbytes
    model.backward(np.ones_like(y))
    return held + max(segment.recompute_nbytes for segment in model.layers)


plain_layers = Sequential(*(list(mlp([256] * 13).layers) + [ReLU()]))
_, plain_saved = forward_saving(plain_layers, np.zeros((64, 256), np.float32))
segment_sizes = [1, 2, 3, 4, 6, 12]
memory = [checkpointed_mlp_memory(k) for k in segment_sizes]
print("blocks per segment   peak activation memory (KiB)   saved vs no checkpointing")
for k, mem in zip(segment_sizes, memory):
    print(f"{k:18d}   {mem / 1024:28.0f}   {1 - mem / plain_saved.nbytes:.0%}")
print(f"no checkpointing      {plain_saved.nbytes / 1024:28.0f}")
best = segment_sizes[int(np.argmin(memory))]
assert best in (3, 4) and min(memory) < 0.5 * plain_saved.nbytes

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(segment_sizes, np.array(memory) / 1024, "o-", label="checkpointed (inputs + one recompute)")
ax.axhline(plain_saved.nbytes / 1024, color="tab:red", ls="--", label="no checkpointing")
ax.set_xlabel("Linear+ReLU blocks per checkpointed segment (12 blocks)")
ax.set_ylabel("peak activation memory (KiB)")
ax.set_title("Checkpointing: the saving depends on the segment size", fontsize=10), ax.legend(fontsize=8)
fig.tight_layout()
save_figure(fig, "08_checkpoint_segments.png", dpi=110)
plt.close(fig)

# %% [markdown]
# **The tutorial's "25% more compute saves 80% memory", honestly.** The slide (from Simon Knowles) measured
# one network: activations stored only at the input of each residual block, batch 16, FP16. Both numbers
# depend on the network and on what is counted. Here recomputing costs one extra forward, +33% of a
# step when backward is 2× forward (+25% if backward is counted as 3× forward, or less when only some
# layers are recomputed); the saving ranges from nothing (a stage of one Linear, whose input *is* its
# activations) to about half for 12 blocks in √n segments above (a ReLU mask is one byte per element,
# so a block holds 5 bytes per element of which checkpointing keeps 4 only at segment inputs), and it
# grows with depth. The "Scaling Up Training" slides'
# "10x larger models ... at only a 20% increase in computation time" (cybertronai/gradient-checkpointing)
# is the same trade on deeper networks. Checkpointing also *adds* a transient: while a segment is
# recomputed its activations exist again, so a stage's peak is its inputs plus one segment.
#
# ## 6. Load imbalance
#
# A pipeline runs at the pace of its slowest stage ("difficult to 'load balance' across all the
# workers", HOT CHIPS write-up). Give the model uneven layers — a network that widens — and split it by layer
# count: the stage with the wide layers takes longest and everyone else waits for it. Splitting by FLOPs
# (minimising the most expensive stage, pipeline_split.py) evens it out as far as whole layers allow.

# %%
uneven = [256] * 5 + [512] * 4  # a network that widens: its later layers cost 2-4x more
costs = layer_costs(mlp(uneven), np.zeros((BATCH, uneven[0]), np.float32))
rows = []
for split in ("layers", "flops"):
    results, trace, makespan, bubble = pipeline_run("gpipe", M, widths=uneven, boundaries=split)
    per_stage = stage_costs(costs, results[0]["boundaries"])
    rows.append((split, results[0]["boundaries"], per_stage, makespan, bubble, trace))
    print(f"split by {split:6s}: boundaries {results[0]['boundaries']}, stage GFLOP "
          f"{[round(c / 1e9, 3) for c in per_stage]}, step {makespan * 1e3:.2f} ms, idle {bubble:.1%}")
assert rows[0][1] == split_by_layers(len(costs), P)
assert rows[1][3] < rows[0][3] and max(rows[1][2]) < max(rows[0][2])

fig, axes = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
for ax, (split, _bounds, _per_stage, makespan, bubble, trace) in zip(axes, rows):
    draw_ops(ax, trace, f"split by {split}: step {makespan * 1e3:.2f} ms, idle {bubble:.0%}")
fig.tight_layout()
save_figure(fig, "08_load_imbalance.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ## 7. PipeDream: no bubble, stale weights — a learning rate to retune
#
# PipeDream (Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP 2019)
# runs 1F1B's order over the whole stream of micro-batches and never flushes: each backward updates its
# stage at once (minidist/parallel/pipeline/weight_stash.py): filling and draining are paid once per run.
# But between F(m) and B(m) stage s runs P − 1 − s other backwards: m's gradient is P − 1 − s updates old
# when applied. *Weight stashing* keeps F(m)'s weights for B(m): stage s holds up to P − s versions
# (`vertical_sync=True`: all use stage 0's; staleness P − 1). A 4-stage Tanh MLP learns a regression from
# 512 micro-batches of 8 fresh samples (momentum SGD; free links) by synchronous 1F1B (M = 4 per step) and
# PipeDream, each at its rate tuned in one process (`pipedream.replay` = the cluster's run, bitwise).
# PipeDream steps 4× as often (as P = 1 does, never stale), and staleness costs more the larger the rate.

# %%
STREAM, LRS, rng = 512, 0.01 * 2.0 ** np.arange(7), np.random.default_rng(2)
x7 = rng.normal(size=(8 * STREAM, 32))          # float64 throughout: the replays compare bitwise
y7 = mlp([32, 4, 32], seed=7, act=Tanh, dtype=np.float64).forward(x7)
y7 = np.tanh((y7 - y7.mean(0)) / y7.std(0)) + rng.normal(0, 0.1, y7.shape)
student = lambda: Sequential(*mlp([32] * 5, 0, Tanh, np.float64), Tanh())   # 4 equal stages [Linear, Tanh]
sgd = lambda lr: lambda params: SGD(params, lr=lr, momentum=0.9)
KINDS = {"1F1B (M = 4)": (P, 4), "PipeDream": (P, None), "PipeDream, P = 1 (not stale)": (1, None)}


def on_cluster(comm, lr, flush):   # flush=None: PipeDream, else synchronous 1F1B
    pipe, losses = train_on_stream(comm, student(), MSELoss(), sgd(lr), x7, y7, STREAM, flush_every=flush)
    return ([end for task, _, end in pipe.timeline if task.kind == "F"], losses, comm.clock,
            pipe.busy_seconds, getattr(pipe, "stashes", {}).get(pipe.stage))


with np.errstate(all="ignore"):   # the largest rates may diverge
    curves = {(k, lr): train_in_one_process(student(), MSELoss(), np.split(x7, STREAM), np.split(y7, STREAM),
                                            sgd(lr), *KINDS[k]) for k in KINDS for lr in LRS}
sync, pd, fresh = (np.nan_to_num([np.mean(curves[k, lr][-64:]) for lr in LRS], nan=np.inf) for k in KINDS)
(lr_sync, lr_pd), link = LRS[[np.argmin(sync), np.argmin(pd)]], LinkModel(0.0, 0.0)
runs = [run(on_cluster, P, lr, f, link=link, device=DEVICE) for lr, f in ((lr_sync, 4), (lr_pd, None))]
assert [runs[0][-1][1], runs[1][-1][1]] == [curves["1F1B (M = 4)", lr_sync], curves["PipeDream", lr_pd]]
assert [(r[4].peak_versions, max(r[4].staleness)) for r in runs[1]] == [(P - s, P - 1 - s) for s in range(P)]
idle = [1 - sum(r[3] for r in rs) / (P * max(r[2] for r in rs)) for rs in runs]
times, untuned = [rs[-1][2] * 1e3 for rs in runs], pd[LRS == lr_sync][0]
print(f"idle: 1F1B {idle[0]:.2%} (3/7), PipeDream {idle[1]:.2%} (3/515); tuned lr {lr_sync:g} and {lr_pd:g}; "
      f"final loss: 1F1B {min(sync):.4f}, PipeDream {untuned:.4f} at lr {lr_sync:g}, {min(pd):.4f} at "
      f"{lr_pd:g} (not stale: {fresh[LRS == lr_pd][0]:.4f}); {times[0]:.2f} vs {times[1]:.2f} simulated ms")
assert abs(idle[0] - 3 / 7) < 1e-9 and abs(idle[1] - 3 / 515) < 1e-9, "the bubble: once per run, not per step"
assert lr_pd < lr_sync and 1.5 * min(sync) < untuned < np.inf, "it needs retuning (and does not diverge)"
assert min(pd) < 1.1 * min(sync) and times[1] < 0.6 * times[0], "then it keeps up, sooner"
assert np.all(np.diff((pd / fresh)[LRS >= lr_pd]) > 0), "staleness costs more the larger the rate"

fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), layout="tight")
[axes[0].loglog(LRS, finals, "o-", label=k) for k, finals in zip(KINDS, (sync, pd, fresh))]
for i, lr, ls, losses in ((0, lr_sync, "-", runs[0][-1][1]), (1, lr_pd, "-", runs[1][-1][1]),
                          (1, lr_sync, ":", curves["PipeDream", lr_sync])):
    axes[1].semilogy(np.array(runs[i][-1][0][31:]) * 1e3, np.convolve(losses, np.ones(32) / 32, "valid"),
                     label=f"{['1F1B', 'PipeDream'][i]}, lr {lr:g}", color=f"C{i}", ls=ls)
axes[0].set(xlabel="learning rate (SGD, momentum 0.9)", ylabel="loss, last 64 micro-batches", title="Tuning")
axes[1].set(xlabel="simulated time (ms)", ylabel="loss, mean of 32 micro-batches", title="On the cluster")
[ax.legend(fontsize=8) for ax in axes]
save_figure(fig, "08_staleness.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ## What to remember
#
# * A pipeline needs only point-to-point messages between neighbouring stages; it splits the *model*,
#   so it makes models that do not fit on one device trainable.
# * Its cost is idle time: (P−1)/P naive, (P−1)/(M+P−1) with M micro-batches (GPipe, 1F1B): use M ≫ P.
# * GPipe holds all M micro-batches' activations at once; 1F1B holds at most P − s at stage s, same bubble.
# * Checkpointing trades one extra forward (+33%) for keeping only segment inputs; the saving depends on
#   the segment size (√n segments are best) and on the network.
# * The slowest stage sets the pace: balance stages by cost, not by layer count.
# * PipeDream removes the bubble (no flush: each backward updates its stage) with gradients P − 1 − s
#   updates stale at stage s: retune the learning rate. GPipe and 1F1B train exactly like one device.

# %%
# Check yourself (`python -m minidist exercises questions --lesson 08`): the answers, asserted.
gpipe_bubble = lambda P, M: bubble_fraction(make_schedule("gpipe", P, M), P)
check_yourself("08", gpipe_bubble=gpipe_bubble(6, 12),
               held_at_stage_2=tuple(max_in_flight(make_schedule(s, 6, 12), 6)[2] for s in ("gpipe", "1f1b")),
               micro_batches_for_3_percent=next(m for m in itertools.count(1) if gpipe_bubble(8, m) < 0.03))
print(f"lesson ran in {time.perf_counter() - START:.1f} s; figures in {FIGURES}")

# %% [markdown]
# ## Exercises
#
# * `gpipe_schedule` — `gpipe_schedule(P, M)`: the list of 2(M + P − 1) ticks, F(s, m) at tick s + m and
#   B(s, m) at tick (M + P − 1) + (P − 1 − s) + m, each tick's `Op(stage, kind, micro_batch)` sorted by
#   stage. Check: `python -m pytest --exercise gpipe_schedule`.
#
# Hint: `print(format_schedule(make_schedule("gpipe", 4, 3), 4))` prints the wave (section 1).
