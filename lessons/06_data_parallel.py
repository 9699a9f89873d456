# %% [markdown]
# # 06 — Data parallelism
#
# **Goal.** Train one model on many accelerators by splitting every batch between them, and see what it
# costs. We check that data-parallel training *is* the single-process computation, choose the allreduce,
# watch the gradient communication hide behind the backward pass (bucketing and overlap), and read strong
# and weak scaling off the simulated clock — and see where it stops: P can never exceed B.
#
# The slides "Distributed Deep Learning (Part II)" (*Synchronous Data Parallelism*): each processor
# computes the entire model on its part of the batch; the gradients are summed with an allreduce; every
# replica applies the same update
#
#     w¹ = w⁰ − α/B · Σ_{i=1..B} ∂J_i(w⁰)/∂w
#
# `minidist.parallel.data.DataParallel` does exactly that: rank r takes n_r of the B examples,
# backpropagates Σ_{i∈r} ℓ_i / B (its shard's mean loss times n_r / B), and the allreduce *sum* of these
# gradients is the full-batch gradient — also when B does not divide by P.

# %%
import time
from itertools import pairwise

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.cluster import ClusterError, Device, LinkModel, run, run_traced
from minidist.collectives import ALGORITHMS
from minidist.data import load_digits
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.nn.runner import units
from minidist.optim import SGD
from minidist.parallel.data import DataParallel
from minidist.parallel.data.buckets import assign_buckets, ready_layers
from minidist.parallel.data.overlap import step_time
from minidist.sim.collective_cost import collective_seconds, price
from minidist.sim.collective_rounds import schedule
from minidist.sim.plots import figures_dir, plot_overlap, save_figure
from minidist_course.questions import check_yourself

FIGURES = figures_dir()  # figures/, or $MINIDIST_FIGURES (the tests use a temporary folder)
DATA = load_digits()


def mlp(widths, seed=0, dtype=np.float32):
    """Linear layers of the given widths with ReLU in between."""
    rng, layers = np.random.default_rng(seed), []
    for i, (a, b) in enumerate(pairwise(widths)):
        layers += [Linear(a, b, rng=rng, dtype=dtype)] + ([ReLU()] if i < len(widths) - 2 else [])
    return Sequential(*layers)


# %% [markdown]
# ## 0. Why distribute at all: the motivation arithmetic
#
# The sources open with three numbers. The HOT CHIPS write-up: language models "have grown from 'only' 340
# million to 75 billion parameters" in two years, and GPT-3 has 175B; "it would take 355 years and cost
# \$4.6M to naively train (on the lowest priced GPU cloud server on the market)" (also in the "Scaling Up
# Training" slides). Training a transformer of N parameters on D tokens costs about **6·N·D** FLOPs
# (2·N per token forward, 4·N backward; Kaplan et al., "Scaling Laws for Neural Language Models", which
# the slides credit). The 355 years assume, as the estimate they come from (Lambda Labs, 2020) did, one
# V100 sustaining 28 TFLOP/s at \$1.50 per GPU-hour, and GPT-3's 300B training tokens.

# %%
N_PARAMS, TOKENS = 175e9, 300e9
THROUGHPUT, PRICE = 28e12, 1.50           # FLOP/s of one V100 (stated assumption), dollars per GPU-hour
flops = 6 * N_PARAMS * TOKENS
seconds = flops / THROUGHPUT
years, dollars = seconds / (365.25 * 86400), seconds / 3600 * PRICE
print(f"6·N·D = {flops:.3g} FLOPs -> {years:.0f} GPU-years, ${dollars / 1e6:.2f}M at ${PRICE}/GPU-hour")
assert abs(flops - 3.15e23) < 1e21 and round(years) == 356 and abs(dollars / 1e6 - 4.6) < 0.1
# The GPT-3 paper reports 3.14e23 FLOPs (it rounds 6·N·D down); with that number: 355 years, as quoted
assert round(3.14e23 / THROUGHPUT / (365.25 * 86400)) == 355
print(f"on 1,024 such GPUs at perfect scaling: {seconds / 1024 / 86400:.0f} days")
growth = 75e9 / 340e6
print(f"340M -> 75B parameters in two years: x{growth:.0f}, x{growth ** 0.5:.1f} per year")
assert growth > 200 and growth ** 0.5 > 10                       # "an order of magnitude or more every year"

# %% [markdown]
# 355 GPU-years and \$4.7M: the quoted \$4.6M is the same arithmetic, rounded down. The data side, from the
# "Scaling Up Training" slides (GPT-3's training mix). A source of T tokens that
# makes up a fraction w of 300B training tokens is seen w·300B / T times ("epochs elapsed"):

# %%
MIX = [  # (source, tokens in billions, weight in the mix, epochs as printed on the slide)
    ("Common Crawl (filtered)", 410, 0.60, 0.44), ("WebText2", 19, 0.22, 2.9), ("Books1", 12, 0.08, 1.9),
    ("Books2", 55, 0.08, 0.43), ("Wikipedia", 3, 0.03, 3.4),
]
inconsistent = []
for source, tokens, weight, printed in MIX:
    epochs = weight * 300 / tokens
    # the table rounds weights to 1% and tokens to 1B: the widest range its inputs allow
    low, high = (weight - 0.005) * 300 / (tokens + 0.5), (weight + 0.005) * 300 / (tokens - 0.5)
    follows = low <= printed <= high
    inconsistent += [] if follows else [source]
    print(f"{source:>24}: {weight:.0%} x 300B / {tokens}B = {epochs:.2f} epochs "
          f"(range {low:.2f}-{high:.2f}); "
          f"slide {printed}{'' if follows else '  <- does not follow'}")
assert inconsistent == ["WebText2"]
assert round(sum(w for _, _, w, _ in MIX), 2) == 1.01           # the rounded weights add up to 101%

# %% [markdown]
# Every row follows from its columns within their rounding except **WebText2**: 22% of 300B tokens is 66B
# tokens, 3.5 passes over 19B, not 2.9 (2.9 epochs would need about 23B tokens or a weight of 18%). The
# same number is in the GPT-3 paper's table, which the slide copies. The lesson for us: 3·10²³ FLOPs is
# centuries on one accelerator, so training must be spread over many — the rest of this lesson.

# %% [markdown]
# ## 1. The same computation as one process
#
# Four ranks train the digits MLP (64-64-64-10) for 10 steps of a global batch of 50 examples (shards of
# 13, 13, 12, 12) in float64; one process trains the same model on the full batches. Same seed, same
# batches: the parameters must agree to rounding, and the four replicas must be bitwise identical.

# %%
WIDTHS, STEPS, BATCH = [64, 64, 64, 10], 10, 50
batches = [np.arange(i * BATCH, (i + 1) * BATCH) for i in range(STEPS)]


def train_dp(comm, algorithm="ring", bucket_bytes=2**12):
    model = mlp(WIDTHS, dtype=np.float64)
    dp = DataParallel(comm, model, SGD(model.parameters(), lr=0.1, momentum=0.9), CrossEntropyLoss(),
                      algorithm=algorithm, bucket_bytes=bucket_bytes)
    for idx in batches:
        dp.train_step(DATA.x_train[idx].astype(np.float64), DATA.y_train[idx])
    dp.check_replicas()                          # raises unless the replicas are bitwise identical
    return [p.data for p in model.parameters()]


single = mlp(WIDTHS, dtype=np.float64)
optimizer, loss_fn = SGD(single.parameters(), lr=0.1, momentum=0.9), CrossEntropyLoss()
for idx in batches:
    optimizer.zero_grad()
    loss_fn.forward(single.forward(DATA.x_train[idx].astype(np.float64)), DATA.y_train[idx])
    single.backward(loss_fn.backward())
    optimizer.step()

replicas = run(train_dp, 4)
worst = max(float(np.max(np.abs(a - p.data) / (np.abs(p.data) + 1e-12)))
            for a, p in zip(replicas[0], single.parameters()))
print(f"largest relative difference, 4 ranks vs one process, after {STEPS} steps: {worst:.1e}")
assert worst < 1e-10
assert all(np.array_equal(a, b) for r in replicas[1:] for a, b in zip(r, replicas[0]))

# %% [markdown]
# ## 2. Which allreduce, and what it costs per step
#
# Every step moves the whole gradient, |W| = 8,970 parameters. With one bucket (the whole gradient, one
# allreduce per step) each rank sends what the collectives lesson derived: ring and Rabenseifner
# 2(P−1)/P·|W|, recursive doubling log2 P·|W|, naive (P−1)|W|, and the parameter server's root (P−1)|W|.
# The cluster's ledger counts the bytes; the α-β clock the time (default link: α = 5 us, 25 GB/s).

# %%
P, NBYTES = 4, 8970 * 4


def bytes_and_time(comm, algorithm):
    model = mlp(WIDTHS)
    dp = DataParallel(comm, model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), algorithm=algorithm,
                      bucket_bytes=10**9)
    sent, clock = comm.stats.bytes_sent, comm.clock
    dp.train_step(DATA.x_train[:64], DATA.y_train[:64])
    return comm.stats.bytes_sent - sent, comm.clock - clock


print(f"{'algorithm':>19}  {'bytes sent per rank':>28}  {'simulated step (us)':>19}")
for algorithm in sorted(ALGORITHMS):
    measured = run(bytes_and_time, P, algorithm)
    exact = price(schedule(algorithm, P), 8970, 4, LinkModel())
    assert [b for b, _ in measured] == exact.bytes_sent    # the ledger equals the schedule, byte for byte
    print(f"{algorithm:>19}  {[b for b, _ in measured]!s:>28}  {max(t for _, t in measured) * 1e6:19.1f}")
print(f"ring formula 2(P-1)/P |W| = {2 * (P - 1) / P * NBYTES:.0f} bytes")

# %% [markdown]
# The ring and Rabenseifner send the least per rank, and for large gradients their time hardly grows
# with P; for this small model latency (α per message) dominates, so the few-message recursive doubling
# and tree are fastest here. MPICH's "auto" rule chooses by message size.
#
# ## 3. Buckets and overlap
#
# Backward produces the gradients from the last layer to the first. DDP packs them, in that order, into
# buckets of `bucket_bytes` and starts each bucket's allreduce as soon as its last gradient is ready, so
# the communication of layer K overlaps the backward pass of layer K−1 ("Scaling Up Training"). Below: a
# 4-layer 512-wide MLP on 4 ranks, per-rank batch 32, on 0.25 TFLOP/s devices (so that the backward pass takes
# longer than the gradient's allreduce and can hide it; on a 15.7 TFLOP/s V100 this small step is all
# communication) and 25 GB/s links — one step with one allreduce after backward, one allreduce per
# parameter, and 1 MiB buckets.

# %%
BIG = [512, 512, 512, 512, 10]


def one_step(comm, bucket_bytes, overlap):
    model = mlp(BIG, seed=1)
    dp = DataParallel(comm, model, SGD(model.parameters(), lr=0.01), CrossEntropyLoss(),
                      bucket_bytes=bucket_bytes, overlap=overlap)
    x = np.random.default_rng(2).normal(size=(128, 512)).astype(np.float32)
    y = np.arange(128) % 10
    dp.clock.spans, start = [], comm.clock
    dp.train_step(x, y)
    return dp.clock.spans, comm.clock - start, start


configs = {"one allreduce after backward": (10**9, False), "one allreduce per parameter": (None, True),
           "1 MiB buckets, overlapped": (2**20, True)}
fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
times = {}
for ax, (name, (bucket_bytes, overlap)) in zip(axes, configs.items()):
    results, trace = run_traced(one_step, 4, bucket_bytes, overlap, device=Device(flops=2.5e11))
    start = results[0][2]
    trace.spans = [s for s in trace.spans if s.start >= start and s.rank < 2]   # the step, ranks 0 and 1
    plot_overlap(trace, [r[0] for r in results[:2]], ax=ax, title=name)
    times[name] = max(r[1] for r in results)
    compute = results[0][0][-1].end - results[0][0][0].start
    print(f"{name:>30}: step {times[name] * 1e6:6.1f} us, compute {compute * 1e6:5.1f} us, "
          f"exposed communication {(times[name] - compute) * 1e6:6.1f} us")
fig.tight_layout()
save_figure(fig, "06_overlap.png", dpi=100)
plt.close(fig)
assert times["1 MiB buckets, overlapped"] < times["one allreduce after backward"]

# %% [markdown]
# Without overlap the step is compute + communication. One allreduce per parameter overlaps, but pays α
# per tensor and per algorithm step (here 2(P−1) = 6 messages for each of 8 tensors). Buckets overlap
# *and* keep the message count low. What stays exposed is the last bucket: the first layer's gradients
# are ready only when backward ends.
#
# ## 4. Strong and weak scaling, P = 1 … 64
#
# The same schedule in closed form (`minidist.parallel.data.overlap.step_time`: each bucket starts at
# max(ready, previous bucket done), the step ends at max(backward end, last allreduce end)). First we
# check the closed form against the cluster's clock at P = 2 and 4, then sweep P for a 3-layer 1024-wide
# MLP (3.2 M parameters, 12.6 MB of gradients), one bucket per layer:
#
# * **strong scaling**: global batch fixed at B = 16384; each rank computes B/P examples;
# * **weak scaling**: 1024 examples per rank; the global batch grows as 1024 P.
#
# Overlaid: the Part II slides' T_comm = 2 Σ_i (α(P−1) + β (P−1)/P |W_i|). Its bandwidth term hardly depends
# on P ("comm time of ring allreduce is independent of the number of processors"); its latency term grows as
# α(P−1) per layer. Meanwhile the compute per rank shrinks as 1/P (strong) or stays (weak). An MLP does
# only 6 FLOPs per parameter and example, so it needs many examples per rank (here ~1000 on a V100) to
# hide 12.6 MB of gradients; convolutions reuse each weight far more often.

# %%
device, link = Device(), LinkModel()


def schedule_of(widths, per_rank_batch, world_size, bucket_bytes):
    """Per-layer forward seconds, bucket ready layers and bucket allreduce seconds of one step."""
    model = mlp(widths)
    layers = units(model)
    forward, shape = [], (per_rank_batch, widths[0])
    for layer in layers:
        forward.append(layer.flops(shape) / device.flops)
        shape = (per_rank_batch, layer.out_features) if isinstance(layer, Linear) else shape
    buckets = assign_buckets(model.parameters(), bucket_bytes)
    seconds = [collective_seconds("ring", world_size, b.size, 4, link) for b in buckets]
    return forward, ready_layers(layers, buckets), seconds


def measured_step(comm, widths, per_rank_batch, bucket_bytes):
    model = mlp(widths)
    dp = DataParallel(comm, model, SGD(model.parameters(), lr=0.01), CrossEntropyLoss(),
                      bucket_bytes=bucket_bytes)
    x = np.zeros((per_rank_batch * comm.world_size, widths[0]), np.float32)
    start = comm.clock
    dp.train_step(x, np.zeros(len(x), dtype=int))
    return comm.clock - start


SMALL = [256, 256, 256, 10]
for world_size in (2, 4):
    clock = max(run(measured_step, world_size, SMALL, 16, 2**17))
    model_time = step_time(*schedule_of(SMALL, 16, world_size, 2**17))
    print(f"P = {world_size}: cluster clock {clock * 1e6:.2f} us, closed form {model_time * 1e6:.2f} us")
    assert abs(clock - model_time) < 1e-9 * clock

WIDE, B, PER_RANK = [1024, 1024, 1024, 1024], 16384, 1024
layer_bytes = [(a * b + b) * 4 for a, b in pairwise(WIDE)]
ps = [1, 2, 4, 8, 16, 32, 64]
t1 = step_time(*schedule_of(WIDE, B, 1, 2**22))
strong = [step_time(*schedule_of(WIDE, B // p, p, 2**22)) for p in ps]
weak = [step_time(*schedule_of(WIDE, PER_RANK, p, 2**22)) for p in ps]
weak1 = weak[0]
tcomm = [sum(2 * (link.alpha * (p - 1) + link.beta * (p - 1) / p * w) for w in layer_bytes) for p in ps]

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
ax1.plot(ps, [t1 / t for t in strong], "o-", label=f"strong scaling (B = {B})")
ax1.plot(ps, [p * weak1 / t for p, t in zip(ps, weak)], "s-", label=f"weak scaling ({PER_RANK} per rank)")
ax1.plot(ps, ps, "k:", label="ideal")
ax1.set(xscale="log", yscale="log", xlabel="ranks P", ylabel="speedup (examples per second vs P = 1)",
        title="simulated clock, ring allreduce, overlapped")
ax1.legend()
ax2.plot(ps, [t * 1e3 for t in strong], "o-", label="strong: step time")
ax2.plot(ps, [t * 1e3 for t in weak], "s-", label="weak: step time")
ax2.plot(ps[1:], [t * 1e3 for t in tcomm[1:]], "k--", label="slides' T_comm (ring, per layer)")
ax2.plot(ps, [3 * sum(f) * 1e3 for f in (schedule_of(WIDE, B // p, p, 2**22)[0] for p in ps)], "g:",
         label="strong: compute per rank")
ax2.set(xscale="log", yscale="log", xlabel="ranks P", ylabel="milliseconds", title="where the time goes")
ax2.legend(fontsize="small")
fig.tight_layout()
save_figure(fig, "06_scaling.png", dpi=100)
plt.close(fig)
for p, s, w, c in zip(ps, strong, weak, tcomm):
    print(f"P = {p:2d}: strong step {s * 1e3:6.3f} ms (speedup {t1 / s:5.2f}), weak step {w * 1e3:6.3f} ms "
          f"(efficiency {weak1 / w:4.2f}), slides' T_comm {c * 1e3:6.3f} ms")
bandwidth = [sum(2 * link.beta * (p - 1) / p * w for w in layer_bytes) for p in ps]
assert bandwidth[-1] < 1.01 * 2 * bandwidth[1]       # the β term: (P−1)/P, from 1/2 at P = 2 to ~1
assert weak1 / weak[-1] > 3 * t1 / strong[-1] / ps[-1]   # at P = 64 weak scaling keeps 3x the efficiency
assert t1 / strong[-1] < t1 / strong[ps.index(16)]       # strong scaling peaks, then gets slower

# %% [markdown]
# Strong scaling runs out: at large P each rank computes only a few examples, and the allreduce, whose
# time does not shrink with P, is all that is left — beyond P ≈ 16 more ranks make the step *slower*.
# Weak scaling holds its efficiency much longer, as long as the per-rank compute can hide T_comm; it
# degrades here through the latency term 2α(P−1) per bucket. That is why data-parallel training grows the
# batch with P — and why lesson 07 is about large batches.
#
# ## 5. The limit P ≤ B
#
# Every rank needs at least one example: with B = 3 and P = 4 there is nothing for rank 3 to do, and
# `DataParallel` says so.

# %%


def too_small(comm):
    model = mlp(WIDTHS)
    DataParallel(comm, model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss()).train_step(
        DATA.x_train[:3], DATA.y_train[:3])


try:
    run(too_small, 4)
    raise AssertionError("expected an error")
except ClusterError as error:
    assert "P <= B" in str(error)
    print(str(error).splitlines()[0])

# %% [markdown]
# ## 6. Real wall-clock on this machine: P = 1 and 2
#
# The clock above is simulated. The processes are real, so on a machine with two cores two ranks really
# do compute in parallel: 5 steps of a 512-1024-1024-10 MLP (global batch 256) on the digits, upsampled
# to 512 features. Each rank uses one BLAS thread.
# (The machine is shared while the course's tests run: expect noise.)

# %%
x_wide = np.repeat(DATA.x_train, 8, axis=1).astype(np.float32)


def epoch_wall(comm):
    model = mlp([512, 1024, 1024, 10])
    dp = DataParallel(comm, model, SGD(model.parameters(), lr=0.01), CrossEntropyLoss())
    comm.barrier()
    start = time.perf_counter()
    for lo in range(0, 1280, 256):
        dp.train_step(x_wide[lo:lo + 256], DATA.y_train[lo:lo + 256])
    return time.perf_counter() - start


wall = {p: max(run(epoch_wall, p)) for p in (1, 2)}
print(f"wall-clock of 5 steps: P = 1 {wall[1]:.2f} s, P = 2 {wall[2]:.2f} s, speedup "
      f"{wall[1] / wall[2]:.2f}x")

# %% [markdown]
# ## Exercises
#
# * `dp_bucketed_allreduce` — `allreduce_bucket(comm, grads, algorithm, buffer)`: flatten one bucket of
#   gradients into one buffer, allreduce it in one call, copy each piece of the sum back into its
#   gradient (in place). Check: `python -m pytest --exercise dp_bucketed_allreduce`.
#
# Hint: `np.concatenate([g.ravel() for g in grads], out=buffer)`, then
# `minidist.collectives.allreduce(comm, flat, algorithm=algorithm)`; write back with `g[...] = ...`, since
# the optimizer holds references to the gradient arrays.

# %%
# Check yourself (`python -m minidist exercises questions --lesson 06`): the answers, asserted.
ten_gb = LinkModel(alpha=5e-6, beta=1e-10)
check_yourself("06", gradient_bytes=price(schedule("ring", 8), 25_000_000, 4, ten_gb).bytes_sent[0],
               gradient_seconds=collective_seconds("ring", 8, 25_000_000, 4, ten_gb),
               overlap_seconds=tuple(step_time([0.01] * 4, [3, 2, 1, 0], [0.015] * 4, overlap=o)
                                     for o in (False, True)))
