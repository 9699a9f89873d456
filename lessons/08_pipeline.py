# %% [markdown]
# # 08 — Pipeline parallelism: micro-batches, the bubble, 1F1B, activation memory and checkpointing
#
# **Goal.** Cut a model into P stages on P (simulated) accelerators and train it with only point-to-point
# messages between neighbours. See why the naive pipeline leaves most devices idle, how GPipe's
# micro-batches shrink that idle time — the *bubble* — to (P−1)/(M+P−1), what that costs in activation
# memory, how the 1F1B schedule keeps GPipe's bubble with far less memory, what gradient checkpointing
# trades, what uneven stages cost, and why PipeDream's way of removing the bubble entirely (stale
# weights) has not caught on.
#
# Seeds: `slides-ai-systems-distributed-dl-part2` ("Pipeline parallelism ... No collective, only P2P ...
# Bubbles in pipeline ... Removing bubbles leads to stale weights"; "GPipe: Reduce Bubble with
# Micro-Batching ... Con: Significantly increases activation memory"; "PipeDream: Use Async Updates to
# remove Bubble"), `slides-ml-systems-design-scaling-up-training` ("split mini-batch into sequential
# micro-batches", "Gradient Checkpointing"), `slides-hardware-accelerators-for-training-dnns` ("25% More
# Compute Saves 80% memory") and `blog-hotchips-scaling-dl-training` (load balance).
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

from minidist.cluster import Device, LinkModel, run_traced
from minidist.nn import Linear, MSELoss, ReLU, Sequential
from minidist.nn.checkpoint import Checkpoint, forward_saving
from minidist.optim import SGD
from minidist.parallel.pipeline import Pipeline, format_schedule, make_schedule, max_in_flight
from minidist.parallel.pipeline.split import layer_costs, split_by_layers, stage_costs
from minidist.plots import figures_dir, save_figure

FIGURES = figures_dir()  # figures/, or $MINIDIST_FIGURES (the tests use a temporary folder)
START = time.perf_counter()

# The simulated machine: NVLink-like links (α = 5 µs, 25 GB/s) and a 100 GFLOP/s device — slow on
# purpose, so that computing a stage takes much longer than sending its activations, as it does for the
# large models pipelines are used for. (Lesson 04 shows the clock and the link model.)
LINK, DEVICE = LinkModel(), Device(flops=1e11)
P, WIDTH, BATCH = 4, 512, 128


def mlp(widths: list[int], seed: int = 0) -> Sequential:
    """Linear + ReLU blocks through the given widths (the last Linear has no ReLU)."""
    rng, layers = np.random.default_rng(seed), []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(Linear(a, b, rng=rng))
        if i < len(widths) - 2:
            layers.append(ReLU())
    return Sequential(*layers)


def train_once(comm, widths, schedule, M, checkpoint=False, boundaries="layers"):
    """One pipelined SGD step on a fixed batch; returns what this stage measured."""
    data = np.random.default_rng(1)
    x = data.normal(size=(BATCH, widths[0])).astype(np.float32)
    target = data.normal(size=(BATCH, widths[-1])).astype(np.float32)
    pipe = Pipeline(comm, mlp(widths), loss_fn=MSELoss(), num_micro_batches=M, schedule=schedule,
                    checkpoint=checkpoint, boundaries=boundaries, sample=x)
    pipe.train_step(x, target, SGD(pipe.parameters(), lr=0.01))
    return {"busy": pipe.busy_seconds, "end": comm.clock, "memory": pipe.memory,
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
    ax.set_yticks(range(P), [f"stage {s}" for s in range(P)])
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (ms)")
    ax.set_title(title, fontsize=10)


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
# messages). That is the "bubble" of the seed's pipeline slide.

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
M = 8
f1b_results, f1b_trace, f1b_time, f1b_bubble = pipeline_run("1f1b", M)
gpipe_results = gpipe[M][0]
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
        times, sizes = zip(*res[s]["memory"])
        ax.step(np.array(times) * 1e3, np.array(sizes) / 1024, where="post", lw=1.4,
                label=f"stage {s}: peak {res[s]['peak'] / 1024:.0f} KiB")
    ax.set_title(f"{name}: activation memory held per stage", fontsize=10)
    ax.set_xlabel("simulated time (ms)")
    ax.set_ylabel("KiB")
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
plain_peak = max(r["peak"] for r in gpipe_results)
ckpt_peak = max(r["peak"] for r in ckpt_results)
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
ax.set_title("Checkpointing: the saving depends on the segment size", fontsize=10)
ax.legend(fontsize=8)
fig.tight_layout()
save_figure(fig, "08_checkpoint_segments.png", dpi=110)
plt.close(fig)

# %% [markdown]
# **The seed's "25% more compute saves 80% memory", honestly.** The slide (from Simon Knowles) measured
# one network: activations stored only at the input of each residual block, batch 16, FP16. Both numbers
# depend on the network and on what is counted. Here recomputing costs one extra forward, +33% of a
# step when backward is 2× forward (+25% if backward is counted as 3× forward, or less when only some
# layers are recomputed); the saving ranges from nothing (a stage of one Linear, whose input *is* its
# activations) to about half for 12 blocks in √n segments above (a ReLU mask is one byte per element,
# so a block holds 5 bytes per element of which checkpointing keeps 4 only at segment inputs), and it
# grows with depth. The other seed's
# "10x larger models ... at only a 20% increase in computation time" (cybertronai/gradient-checkpointing)
# is the same trade on deeper networks. Checkpointing also *adds* a transient: while a segment is
# recomputed its activations exist again, so a stage's peak is its inputs plus one segment.
#
# ## 6. Load imbalance
#
# A pipeline runs at the pace of its slowest stage ("difficult to 'load balance' across all the
# workers", blog-hotchips). Give the model uneven layers — a network that widens — and split it by layer
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
# ## 7. PipeDream: no bubble, but stale weights
#
# PipeDream keeps every stage busy by never waiting for the batch to drain: each stage updates its
# weights as soon as a micro-batch's backward is done and immediately starts the next forward. The
# price is that a micro-batch's gradient is computed with weights that are already some updates old by
# the time it is applied — at stage s about P − 1 − s updates (PipeDream stashes the weight version used
# in forward so that forward and backward at least agree). As the seed says: "this does affect model
# accuracy and convergence, and as such has not been adopted in industry."
#
# A small demonstration in one process: SGD on a least-squares problem where the gradient applied at
# step t was computed at the weights of step t − τ (τ = 0: synchronous, as GPipe and 1F1B; τ = 3: the
# first stage of a 4-stage PipeDream). At a learning rate where synchronous SGD converges in a few
# steps, τ = 1 overshoots and converges later, τ = 3 diverges; only a smaller learning rate tames it —
# and then training is slower than synchronous SGD was.

# %%
def delayed_sgd(delay: int, lr: float, steps: int = 60) -> list[float]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8))
    target = x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(256, 1))
    model, loss_fn = Linear(8, 1, rng=np.random.default_rng(1), dtype=np.float64), MSELoss()
    optimizer = SGD(model.parameters(), lr=lr)
    history, old_weights, losses = [], [], []
    for _ in range(steps):
        old_weights.append([p.data.copy() for p in model.parameters()])
        current = [p.data.copy() for p in model.parameters()]
        for p, w in zip(model.parameters(), old_weights[max(0, len(old_weights) - 1 - delay)]):
            p.data[...] = w  # compute the gradient at the stale weights ...
        model.zero_grad()
        losses.append(loss_fn.forward(model.forward(x), target))
        model.backward(loss_fn.backward())
        for p, w in zip(model.parameters(), current):
            p.data[...] = w  # ... and apply it to the current ones
        optimizer.step()
        history.append(loss_fn.forward(model.forward(x), target))
    return history


fig, ax = plt.subplots(figsize=(7, 3.8))
curves = {}
for delay in (0, 1, 3):
    curves[delay] = delayed_sgd(delay, lr=0.3)
    ax.semilogy(curves[delay], label=f"staleness τ = {delay}, lr = 0.3")
slow = delayed_sgd(3, lr=0.1)
ax.semilogy(slow, "--", label="staleness τ = 3, lr = 0.1")
ax.set_xlabel("SGD step")
ax.set_ylabel("training loss (MSE)")
ax.set_title("Stale gradients (PipeDream-style) at a learning rate synchronous SGD handles", fontsize=10)
ax.legend(fontsize=8)
fig.tight_layout()
save_figure(fig, "08_staleness.png", dpi=110)
plt.close(fig)
for delay, losses in curves.items():
    print(f"τ = {delay}, lr = 0.3: loss after 10 steps {losses[9]:.4g}, after 60 steps {losses[-1]:.4g}")
print(f"τ = 3, lr = 0.1: loss after 10 steps {slow[9]:.4g}, after 60 steps {slow[-1]:.4g}")
assert curves[0][9] < curves[1][9] < curves[3][9] and curves[1][-1] < 1.01 * curves[0][-1]
assert curves[3][-1] > 1e3 * curves[0][-1], "τ = 3 diverges at the synchronous learning rate"
assert slow[-1] < 1.01 * curves[0][-1] and slow[9] > 2 * curves[0][9], "a smaller rate converges, later"

# %% [markdown]
# ## What to remember
#
# * A pipeline needs only point-to-point messages between neighbouring stages; it splits the *model*,
#   so it makes models that do not fit on one device trainable.
# * Its cost is idle time: (P−1)/P for the naive pipeline, (P−1)/(M+P−1) with M micro-batches (GPipe,
#   1F1B). Use M ≫ P.
# * GPipe holds all M micro-batches' activations at once; 1F1B holds at most P − s at stage s, same bubble.
# * Checkpointing trades one extra forward (+33%) for keeping only segment inputs; the saving depends on
#   the segment size (√n segments are best) and on the network.
# * The slowest stage sets the pace: balance stages by cost, not by layer count.
# * Removing the bubble with asynchronous updates (PipeDream) makes gradients stale; synchronous
#   schedules with flushes (GPipe, 1F1B) train exactly like one device.

# %%
print(f"lesson ran in {time.perf_counter() - START:.1f} s; figures in {FIGURES}")

# %% [markdown]
# ## Exercises
#
# * `gpipe_schedule` — `gpipe_schedule(P, M)`: the list of 2(M + P − 1) ticks, F(s, m) at tick s + m and
#   B(s, m) at tick (M + P − 1) + (P − 1 − s) + m, each tick's `Op(stage, kind, micro_batch)` sorted by
#   stage. Check: `python -m pytest --exercise gpipe_schedule`.
#
# Hint: `print(format_schedule(make_schedule("gpipe", 4, 3), 4))` prints the wave (section 1).
