# %% [markdown]
# # 27 — Thousands of ranks: point-to-point against all-reduce
#
# **Goal.** The "Distributed DL Part II" slides sum up pipeline parallelism as "ideal for large scale
# training to thousands of processes where point-to-point communication is much cheaper than collective
# operations such as allreduce or all-gather". Lesson 15 checks the all-reduce algorithms on 8 ranks; here
# we sweep P from 2 to 16,384 on the α-β model (each message of b bytes costs α + bβ) and find the P where
# a pipeline's neighbour sends become cheaper than data parallelism's all-reduce of the gradient.
#
# What one rank sends in a step (priced by `allreduce_cost`, the slides' closed form, and `LinkModel.time`):
#
# - **data parallelism**: all-reduce the gradient, n bytes. Ring: 2(P − 1) messages,
#   2(P − 1)α + 2(P − 1)/P · nβ. Tree: 2 log2 P steps of the whole array, 2 log2 P (α + nβ).
#   Rabenseifner: 2 log2 P α + 2(P − 1)/P · nβ.
# - **a pipeline**: a middle stage sends each of the m micro-batches' activations (b·s·h elements)
#   forward and their gradients (the same shape) backward: 2m messages, 2m(α + aβ) with a the bytes of
#   one micro-batch's activations. The first stage sends only the m forward messages and the last only
#   the m backward ones; none of the counts depends on P.
#
# The all-reduce's *latency* term grows with P (linearly on the ring, as log P on the tree); a neighbour
# send is one α whatever P is. So even a pipeline that moves more bytes (this one does) wins past some P.

# %%
import math

import matplotlib
import matplotlib.ticker
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from minidist.cluster import run
from minidist.cluster.machines import NVLINK1, PCIE3_X16
from minidist.nn import GPT, CrossEntropyLoss
from minidist.optim import SGD
from minidist.parallel import Mesh, parallelize
from minidist.sim.collective_cost import allreduce_cost, collective_seconds
from minidist.sim.plots import save_figure

# The fixed model and per-rank batch. A transformer block of hidden size h has 12h² weights (attention's Q,
# K, V and output projections 4h², the MLP's h → 4h → h 8h², biases aside);
# one block's gradient is what a data-parallel rank all-reduces, in FP16 (2 bytes).
H, SEQ = 1024, 2048                    # hidden size h, sequence length s
PARAMETERS = 12 * H * H                # 12.6 M
GRADIENT_BYTES = 2 * PARAMETERS        # n = 25.2 MB of FP16 gradient
MICRO_BATCHES, MICRO_BATCH = 32, 1     # m micro-batches of b samples: a per-rank batch of 32 sequences
ACTIVATION_BYTES = 2 * MICRO_BATCH * SEQ * H    # a: one micro-batch's FP16 activations, b·s·h·2 = 4.2 MB
LINKS = {"NVLink 1 (20 GB/s)": NVLINK1, "PCIe 3.0 x16 (15.75 GB/s)": PCIE3_X16}   # α = 5 µs on both
RANKS = [2 ** k for k in range(1, 15)]                 # 2 … 16,384
ALLREDUCES = ("ring", "tree", "rabenseifner")

print(f"model: {PARAMETERS / 1e6:.1f} M parameters, gradient n = {GRADIENT_BYTES / 1e6:.1f} MB (FP16); "
      f"per-rank batch {MICRO_BATCHES * MICRO_BATCH} sequences of {SEQ} tokens in {MICRO_BATCHES} "
      f"micro-batches, a = b·s·h·2 = {ACTIVATION_BYTES / 1e6:.2f} MB each")


def allreduce_seconds(algorithm, ranks, link):
    """One step's gradient all-reduce on the slides' closed form (γ = 0: the cluster charges no sums)."""
    return allreduce_cost(algorithm, ranks, GRADIENT_BYTES, link.alpha, link.beta).time


def pipeline_seconds(link):
    """A middle stage's sends in one step: m activations forward, m gradients back, one α each."""
    return 2 * MICRO_BATCHES * link.time(ACTIVATION_BYTES)


# The closed form is the exact walk of the schedule where the module says so (P a power of two, n divisible
# by P): check it on 8 ranks before trusting it at 16,384, where the walk would take too long.
for algorithm in ALLREDUCES:
    walked = collective_seconds(algorithm, 8, GRADIENT_BYTES // 2, 2, NVLINK1)
    assert math.isclose(walked, allreduce_seconds(algorithm, 8, NVLINK1), rel_tol=1e-9), algorithm

# %% [markdown]
# ## Counting what each stage sends, on the cluster
#
# The count 2m for a middle stage, m for the first and the last, is what minidist's pipeline sends: a tiny
# GPT on 4 stages, 1F1B with 2 micro-batches, its second training step counted on the pipeline group.

# %%
V, T, D, BATCH, M = 16, 8, 16, 4, 2


def pipeline_step_traffic(comm):
    model = GPT(V, T, 4, D, 2, rng=np.random.default_rng(0), dtype=np.float64)
    trainer = parallelize(model, Mesh(comm, pipeline=comm.world_size), loss_fn=CrossEntropyLoss(),
                          optimizer=lambda ps: SGD(ps, lr=0.1), schedule="1f1b", micro_batches=M)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, V, (BATCH, T + 1))
    trainer.train_step(tokens[:, :-1], tokens[:, 1:])          # the first step also sets things up
    stages, world = trainer.mesh.group("pipeline").stats, comm.stats
    before = stages.messages_sent, stages.bytes_sent, world.messages_sent
    trainer.train_step(tokens[:, :-1], tokens[:, 1:])
    return (stages.messages_sent - before[0], stages.bytes_sent - before[1],
            world.messages_sent - before[2])


traffic = run(pipeline_step_traffic, 4)
one_message = BATCH // M * T * D * 8          # b·s·h float64 elements
assert [t[0] for t in traffic] == [M, 2 * M, 2 * M, M]
assert [t[1] for t in traffic] == [M * one_message, 2 * M * one_message, 2 * M * one_message, M * one_message]
print(f"4 stages, m = {M}: messages sent per stage {[t[0] for t in traffic]}, each b·s·h·8 = {one_message} B")
# The trainer's reported loss is one more thing: a pairwise all-reduce of one float over all the ranks,
# 2(P − 1) messages on the world communicator. At thousands of stages it pays the ring's latency too; a
# run there would have the last stage report it instead. It is left out of the comparison below.
assert all(t[2] == 2 * (4 - 1) for t in traffic)

# %% [markdown]
# ## The sweep: per link, each all-reduce at every power of two, and the pipeline's constant line

# %%
table = {name: {a: [allreduce_seconds(a, p, link) for p in RANKS] for a in ALLREDUCES}
         for name, link in LINKS.items()}
print(f"{'P':>6} " + " ".join(f"{a:>13}" for a in ALLREDUCES) + "   (ms, NVLink 1)")
for i, p in enumerate(RANKS):
    print(f"{p:>6} " + " ".join(f"{1e3 * table['NVLink 1 (20 GB/s)'][a][i]:13.3f}" for a in ALLREDUCES))
for name, link in LINKS.items():
    pipe, sent = pipeline_seconds(link), 2 * MICRO_BATCHES * ACTIVATION_BYTES
    print(f"{name}: pipeline stage {2 * MICRO_BATCHES} messages, {sent / 1e6:.0f} MB per step = "
          f"{1e3 * pipe:.3f} ms; the ring at P = 2: {1e3 * allreduce_seconds('ring', 2, link):.3f} ms")
    # At small P the all-reduce is cheaper: the pipeline sends more bytes (2m·a > n).
    assert allreduce_seconds("ring", 2, link) < pipe and allreduce_seconds("tree", 2, link) < pipe
bytes_ratio = 2 * MICRO_BATCHES * ACTIVATION_BYTES / (2 * GRADIENT_BYTES)   # against the ring's 2(P − 1)/P·n
print(f"the pipeline stage sends {bytes_ratio:.1f}× the bytes a ring all-reduce sends per rank at large P")
assert bytes_ratio > 5


# %% [markdown]
# ## The crossover, found and checked against its closed form
#
# The ring's time is increasing in P, so the first P where it exceeds the pipeline's time T is found by
# bisection over the integers. Its closed form: 2(P − 1)α + 2(P − 1)/P · nβ = T, times P, is the quadratic
# 2αP² + (2nβ − 2α − T)P − 2nβ = 0, and the crossover is the ceiling of its positive root. When the
# latency term dominates, P* ≈ (T − 2nβ)/(2α) + 1: the pipeline's time less the ring's bandwidth term,
# counted in α's. For the tree, 2k(α + nβ) > T first at k = ⌊T / (2(α + nβ))⌋ + 1 steps, P* = 2^k.

# %%
def first_ring_rank_slower(link, pipe):
    """The smallest P with the ring all-reduce slower than the pipeline's step (bisection on integers)."""
    low, high = 2, 2
    while allreduce_seconds("ring", high, link) <= pipe:
        high *= 2
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if allreduce_seconds("ring", middle, link) <= pipe else (low, middle)
    return low


crossover = {}
for name, link in LINKS.items():
    pipe, alpha, n_beta = pipeline_seconds(link), link.alpha, GRADIENT_BYTES * link.beta
    ring_p = first_ring_rank_slower(link, pipe)
    a, b, c = 2 * alpha, 2 * n_beta - 2 * alpha - pipe, -2 * n_beta
    root = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
    assert ring_p == math.floor(root) + 1, (ring_p, root)   # the first integer past the root
    latency_bound = (pipe - 2 * n_beta) / (2 * alpha) + 1
    assert abs(ring_p - latency_bound) / ring_p < 0.01      # the latency term decides it
    tree_p = 2 ** (math.floor(pipe / (2 * (alpha + n_beta))) + 1)
    first_tree = next(p for p, t in zip(RANKS, table[name]["tree"]) if t > pipe)
    assert first_tree == tree_p, (first_tree, tree_p)
    # Rabenseifner's latency term only grows as 2 log2 P α (0.14 ms at P = 16,384): it never crosses here.
    assert all(t < pipe for t in table[name]["rabenseifner"])
    crossover[name] = (ring_p, tree_p)
    print(f"{name}: point-to-point is cheaper than the ring from P = {ring_p:,} (closed-form root "
          f"{root:,.1f}, latency-bound estimate {latency_bound:,.1f}) and than the tree from P = {tree_p:,}; "
          f"Rabenseifner stays cheaper up to 16,384")
assert all(1000 <= ring < 2000 for ring, _ in crossover.values())   # "thousands of processes"
# The slower link makes every byte dearer, the pipeline's more than the ring's (it moves more): a later
# crossover.
assert crossover["PCIe 3.0 x16 (15.75 GB/s)"][0] > crossover["NVLink 1 (20 GB/s)"][0]

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
for ax, (name, link) in zip(axes, LINKS.items()):
    for algorithm, style in zip(ALLREDUCES, ("-o", "-s", "-^")):
        ax.plot(RANKS, [1e3 * t for t in table[name][algorithm]], style, markersize=3,
                label=f"{algorithm} all-reduce")
    ax.plot(RANKS, [1e3 * pipeline_seconds(link)] * len(RANKS), "--k", label="pipeline neighbour sends")
    ax.axvline(crossover[name][0], color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2), ax.set_yscale("log")
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(RANKS[::2]))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FixedFormatter([str(p) for p in RANKS[::2]]))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_title(f"{name}: ring crossover P = {crossover[name][0]:,}", fontsize=9)
    ax.set_xlabel("ranks P")
axes[0].set_ylabel("communication per step (ms, one rank)")
axes[0].legend(fontsize=8)
fig.suptitle(f"{PARAMETERS / 1e6:.1f} M-parameter gradient all-reduced vs {2 * MICRO_BATCHES} "
             f"activation sends of {ACTIVATION_BYTES / 1e6:.1f} MB (α = 5 µs)", fontsize=10)
fig.tight_layout()
save_figure(fig, "27_thousands_of_ranks.png")

# %% [markdown]
# **What to remember.** A neighbour send costs one α however many ranks there are; an all-reduce pays
# 2(P − 1)α on the ring, 2 log2 P α on a tree. The pipeline here moves over 5× the ring's bytes, yet past
# ~1,100 ranks (NVLink) or ~1,400 (PCIe) the ring's latency alone costs more — the slides' "thousands of
# processes"; the crossover is about T / (2α), the pipeline's step counted in latencies. The plain tree
# (whole-array steps: its bandwidth term grows as log P too) loses from P = 64; Rabenseifner's
# bandwidth-optimal log-latency all-reduce stays cheaper to 16,384. And a pipeline pays its bubble (lesson
# 08), which no count of messages shows.
