# %% [markdown]
# # 05 — Collectives: naive, parameter server, ring, tree, recursive doubling, Rabenseifner
#
# **Goal.** Data-parallel training adds up every worker's gradient after each step: an *allreduce*.
# This lesson runs six allreduce algorithms on the simulated cluster of lesson 04, draws who sends which
# chunk at each step, checks the bytes and messages the ledger recorded against the textbook formulas,
# and compares their cost under the α-β model — where latency dominates, where bandwidth does, and why
# the ring's time hardly grows with the number of workers.
#
# The story of the "Scaling Up Training" slides (*p* workers, a tensor of *n* elements):
#
# * **everyone sends everyone** its tensor: total work p · (p − 1) · O(n) = O(np²);
# * **a designated manager** gathers, reduces and sends back: total (p − 1) · 2 · O(n) = O(np), but all
#   of it through the manager;
# * **the ring**: split the tensor into p chunks; p − 1 rounds of reduce-scatter then p − 1 rounds of
#   allgather, each rank sending one chunk per round: everyone does equal O(n) work, *independent of p*.
#
# With a latency α per message and β seconds per byte, the ring costs ("Distributed DL, part II",
# T_comm summed over layers; here one array of n bytes)
#
# $$T_{\mathrm{ring}} = 2(P-1)\,\alpha + 2\,\frac{P-1}{P}\,n\,\beta .$$
#
# The "Hardware Accelerators" tutorial lists what MPI libraries use: for small messages recursive
# doubling or reduce + broadcast (a tree); for large ones the ring or Rabenseifner's algorithm (vector
# halving with distance doubling). minidist implements all of them with nothing but `send`, `recv` and
# `sendrecv` — read `minidist/collectives/ring.py`, `tree.py`, `halving_doubling.py`, `allreduce.py`.

# %%
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist import collectives
from minidist.cluster import LinkModel, run
from minidist.collectives import ALGORITHMS, allreduce, choose_algorithm
from minidist.collectives.allreduce import MPICH_SHORT_MESSAGE_BYTES
from minidist.sim.collective_cost import FORMULAS, allreduce_cost, price
from minidist.sim.collective_rounds import schedule
from minidist.sim.plots import figures_dir, save_figure
from minidist_course.questions import check_yourself

FIGURES = figures_dir()  # figures/, or $MINIDIST_FIGURES (the tests use a temporary folder)
LINK = LinkModel()  # the cluster's default link: alpha = 5 us, beta = 1 / (25 GB/s)
NAMES = [name for name in ALGORITHMS if name in FORMULAS]  # the lectures' six (double_tree: lesson 15)
print(f"link model: alpha = {LINK.alpha * 1e6:.1f} us, 1/beta = {1 / LINK.beta / 1e9:.0f} GB/s")

# %% [markdown]
# ## 1. Every algorithm computes the same sum, bitwise, on every rank
#
# Four ranks, each with its own integer-valued array (so the float sums are exact). After an allreduce
# every rank must hold *bitwise* the same array — otherwise data-parallel replicas would drift apart.
# The algorithms make sure of that: each element's sum is computed once and copied (ring, tree,
# Rabenseifner, parameter server), or computed from the same operands in the same order everywhere (naive
# adds in rank order; in recursive doubling both partners put the lower rank's array first — a + b and
# b + a can differ in the sign of a NaN, and max(−0.0, +0.0) in the sign of the zero).


# %%
def every_algorithm(comm, n):
    x = np.random.default_rng(comm.rank).integers(-9, 10, n).astype(np.float32)
    return x, {name: allreduce(comm, x, algorithm=name) for name in [*NAMES, "auto"]}


results = run(every_algorithm, 4, 1001)
exact_sum = sum(x for x, _ in results)
for name in [*NAMES, "auto"]:
    assert all(out[name].tobytes() == exact_sum.tobytes() for _, out in results), name
print("all 7 choices gave the exact sum, bitwise identical on the 4 ranks (n = 1001, not divisible by 4)")

# %% [markdown]
# ## 2. Step by step, for P = 4
#
# `minidist.sim.collective_rounds` lists the transfers each algorithm's code performs (the tests check it
# against what the cluster recorded). In the figures, a row is a rank; an arrow goes from the sender to
# the receiver and is labelled with the chunk it carries (c0..c3 are the quarters of the array, "all"
# the whole array, x1 rank 1's own input). Red arrows are *added into* the receiver's copy, blue ones
# overwrite it.


# %%
from minidist.sim.schedule_figure import chunk_label, draw_schedule  # noqa: E402

for name in NAMES:
    plan = schedule(name, 4)
    fig = draw_schedule(plan)
    save_figure(fig, f"05_schedule_{name}.png", dpi=110)
    plt.close(fig)
    print(f"{name:19s} {len(plan.steps)} steps, {sum(len(s) for s in plan.steps):2d} messages in total")

ring = schedule("ring", 4)
for k, step in enumerate(ring.steps):
    phase = "reduce-scatter" if k < 3 else "allgather     "
    moves = ", ".join(f"{t.src}->{t.dst} {chunk_label(ring, t)}" for t in step)
    print(f"ring step {k + 1} ({phase}): {moves}")
# After the reduce-scatter, rank r owns the finished chunk r:
assert [t.lo for t in ring.steps[2]] == [(r - 3) % 4 for r in range(4)]

# %% [markdown]
# ## 3. The ledger against the formulas
#
# Every rank's `comm.stats` counts the payload bytes and messages it sent. With P = 4 and n = 2¹⁶ float32
# (256 KiB), the formulas of `minidist.sim.collective_cost` predict (per rank):
#
# | algorithm | bytes sent | messages |
# |---|---|---|
# | naive | (P − 1) n | P − 1 |
# | parameter server | root (P − 1) n, workers n | root P − 1, workers 1 |
# | ring, Rabenseifner | 2 (P − 1)/P · n | 2(P − 1), resp. 2 log2 P |
# | tree | root log2 P · n; 2(P − 1) n over all ranks | |
# | recursive doubling | log2 P · n | log2 P |


# %%
def ledger_of_each(comm, n):
    x = np.ones(n, np.float32)
    out = {}
    for name in NAMES:
        comm.barrier()
        bytes0, messages0, clock0 = comm.stats.bytes_sent, comm.stats.messages_sent, comm.clock
        allreduce(comm, x, algorithm=name)
        out[name] = (comm.stats.bytes_sent - bytes0, comm.stats.messages_sent - messages0,
                     comm.clock - clock0)
    return out


P, N = 4, 2**16
ledgers = run(ledger_of_each, P, N, link=LINK)
print(f"{'algorithm':19s} {'bytes sent per rank (KiB)':34s} {'messages':14s} simulated time (us)")
for name in NAMES:
    sent = [ledgers[r][name][0] for r in range(P)]
    messages = [ledgers[r][name][1] for r in range(P)]
    clock = max(ledgers[r][name][2] for r in range(P))
    formula = allreduce_cost(name, P, 4 * N, LINK.alpha, LINK.beta)
    assert sent == formula.bytes_sent and messages == formula.messages_sent, name
    assert np.isclose(clock, formula.time, rtol=1e-9), name
    print(f"{name:19s} {[s // 1024 for s in sent]!s:34s} {messages!s:14s} {clock * 1e6:8.1f}"
          f"  (formula {formula.time * 1e6:.1f})")
ring_sent = ledgers[0]["ring"][0]
assert ring_sent == 2 * (P - 1) * 4 * N // P
print(f"ring allreduce sent exactly 2(P-1)/P * n = {ring_sent} bytes per rank, as the formula says")
tree_total = sum(ledgers[r]["tree"][0] for r in range(P))
assert tree_total == 2 * (P - 1) * 4 * N
print(f"the tree sent 2(P-1) * n = {tree_total} bytes over all ranks, {ledgers[0]['tree'][0]} of them from "
      f"the root; the parameter server's root sent {ledgers[0]['parameter_server'][0]}: (P-1) * n")

# %% [markdown]
# ## 4. Simulated time against message size: latency-bound vs bandwidth-bound
#
# For small arrays the α terms dominate: the fewer *messages*, the better — recursive doubling (log2 P
# messages) wins and the ring, with 2(P − 1) messages, loses. For large arrays the β terms dominate: the
# fewer *bytes*, the better — the ring and Rabenseifner send 2(P − 1)/P · n, recursive doubling log2 P · n
# and the tree 2 log2 P · n along its critical path. The curves below are the closed-form formulas for
# P = 8; the dots are the simulated clock of real runs on the cluster.

# %%
P = 8
sizes = 2.0 ** np.arange(3, 29)  # 8 B .. 256 MiB
curves = {name: np.array([allreduce_cost(name, P, s, LINK.alpha, LINK.beta).time for s in sizes])
          for name in NAMES}


def clock_of_each(comm, n):
    x = np.ones(n, np.float32)
    times = {}
    for name in NAMES:
        comm.barrier()
        start = comm.clock
        allreduce(comm, x, algorithm=name)
        times[name] = comm.clock - start
    return times


measured_sizes = [64, 4096, 2**18]  # elements (float32): 256 B, 16 KiB, 1 MiB
measured = {n: run(clock_of_each, P, n, link=LINK) for n in measured_sizes}

fig, ax = plt.subplots(figsize=(8, 5))
for name, color in zip(NAMES, plt.cm.tab10.colors):
    ax.loglog(sizes, curves[name] * 1e6, label=name, color=color)
    for n in measured_sizes:
        clock = max(measured[n][r][name] for r in range(P))
        assert np.isclose(clock, allreduce_cost(name, P, 4 * n, LINK.alpha, LINK.beta).time, rtol=1e-9)
        ax.loglog(4 * n, clock * 1e6, "o", color=color)

best_small = min(NAMES, key=lambda name: curves[name][0])
best_large = sorted(NAMES, key=lambda name: curves[name][-1])[:2]
assert best_small == "recursive_doubling" and set(best_large) == {"ring", "rabenseifner"}
# Where does the ring overtake the tree? 2 log2P (a + n b) = 2 (P-1) a + 2 (P-1)/P n b, solved for n:
log2p = 3
crossing = (2 * (P - 1) - 2 * log2p) * LINK.alpha / ((2 * log2p - 2 * (P - 1) / P) * LINK.beta)
ring_at, tree_at = (allreduce_cost(a, P, crossing, LINK.alpha, LINK.beta).time for a in ("ring", "tree"))
assert np.isclose(ring_at, tree_at)
rd_vs_rab = sizes[np.argmax(curves["rabenseifner"] < curves["recursive_doubling"])]
ax.axvline(crossing, color="gray", ls=":")
ax.text(crossing * 1.15, 2e4, f"ring = tree\nat {crossing / 1024:.0f} KiB", color="gray")
ax.set(xlabel="array size n (bytes)", ylabel="simulated time (us)")
ax.set_title(f"allreduce on P = {P} ranks, alpha = {LINK.alpha * 1e6:.0f} us, "
             f"1/beta = {1 / LINK.beta / 1e9:.0f} GB/s (lines: formulas, dots: cluster clock)", fontsize=9)
ax.legend()
fig.tight_layout()
save_figure(fig, "05_time_vs_size.png", dpi=110)
plt.close(fig)
print(f"small arrays: {best_small} is fastest (fewest messages); large: {best_large} (fewest bytes)")
print(f"the ring overtakes the tree above {crossing / 1024:.0f} KiB; Rabenseifner overtakes recursive "
      f"doubling from {rd_vs_rab / 1024:.0f} KiB here")
# MPICH switches at 2 KiB: the crossing scales with alpha / beta (latency x bandwidth), which is far
# larger for this model's 25 GB/s links than for the networks MPICH's default was tuned on.

# %% [markdown]
# ## 5. Simulated time against the number of ranks, at fixed n
#
# At n = 64 MiB the ring's bandwidth term 2 (P − 1)/P · nβ approaches 2nβ and stops growing; only its
# latency term 2(P − 1)α grows, and at this size it is small. The tree and recursive doubling grow as
# log P (every step sends the whole array); the naive algorithm and the parameter server grow linearly.
# Recursive doubling and Rabenseifner dip at powers of two: any other P pays for the fold (two extra
# whole-array steps). Points: the simulated clock of ring runs on the cluster with P = 2, 4, 8.

# %%
n_bytes = 64 * 2**20
world_sizes = np.arange(2, 65)
exact_times = {name: [price(schedule(name, int(p)), n_bytes // 4, 4, LINK).time
                      for p in world_sizes] for name in NAMES}


def ring_clock(comm, n):
    x = np.ones(n, np.float32)
    start = comm.clock
    allreduce(comm, x, algorithm="ring")
    return comm.clock - start


ring_points = {p: max(run(ring_clock, p, n_bytes // 4, link=LINK)) for p in (2, 4, 8)}
fig, ax = plt.subplots(figsize=(8, 5))
for name, color in zip(NAMES, plt.cm.tab10.colors):
    ax.plot(world_sizes, np.array(exact_times[name]) * 1e3, label=name, color=color)
for p, clock in ring_points.items():
    assert np.isclose(clock, exact_times["ring"][p - 2], rtol=1e-9)
    ax.plot(p, clock * 1e3, "o", color=plt.cm.tab10.colors[NAMES.index("ring")])
ax.set(yscale="log", xlabel="number of ranks P", ylabel="simulated time (ms)")
ax.set_title("allreduce of 64 MiB: the ring's line is flat (dots: ring runs on the cluster)", fontsize=10)
ax.legend()
fig.tight_layout()
save_figure(fig, "05_time_vs_world_size.png", dpi=110)
plt.close(fig)
ring_growth = exact_times["ring"][-1] / exact_times["ring"][2]  # P = 64 vs P = 4
tree_growth = exact_times["tree"][-1] / exact_times["tree"][2]
assert ring_growth < 1.5 and tree_growth > 2.5  # ring: 2(P-1)/P goes 1.5 -> 1.97; tree: log2 P goes 2 -> 6
print(f"from P = 4 to P = 64 the ring's time grows {ring_growth:.2f}x, the tree's {tree_growth:.2f}x, "
      f"naive {exact_times['naive'][-1] / exact_times['naive'][2]:.1f}x")

# %% [markdown]
# ## 6. Real wall-clock on this machine, beside the model
#
# The simulated clock models an accelerator interconnect. The real cluster is processes on one computer:
# a "message" is a copy into shared memory plus a semaphore wake-up, and P processes share the cores.
# We time each algorithm for real (P = 4) and fit this machine's own α and β to the ring's formula. Only
# the shapes are comparable: on a laptop the "latency" is tens of microseconds (operating-system
# wake-ups, far above the 5 us of the model) and the "bandwidth" is that of a memory copy. Measured
# times differ from run to run, so figures/05_wall_clock.png is yours alone: it is not committed
# (.gitignore), unlike the other figures, which are the same bytes on every run.


# %%
def wall_clock(comm, sizes, repeats):
    times = {}
    for n in sizes:
        x = np.ones(n, np.float32)
        for name in ("ring", "tree", "recursive_doubling", "rabenseifner"):
            allreduce(comm, x, algorithm=name)  # warm up
            best = np.inf
            for _ in range(repeats):  # the best of a few: the machine is shared, noise only adds time
                comm.barrier()
                start = time.perf_counter()
                allreduce(comm, x, algorithm=name)
                best = min(best, time.perf_counter() - start)
            times[name, n] = best
    return times


P = 4
wall_sizes = [2**k for k in range(8, 23, 2)]  # 256 .. 4 Mi elements (1 KiB .. 16 MiB)
walls = run(wall_clock, P, wall_sizes, 5, timeout=300.0)
fig, ax = plt.subplots(figsize=(8, 5))
for name, color in zip(("ring", "tree", "recursive_doubling", "rabenseifner"), plt.cm.tab10.colors):
    real = [max(w[name, n] for w in walls) for n in wall_sizes]
    model = [allreduce_cost(name, P, 4 * n, LINK.alpha, LINK.beta).time for n in wall_sizes]
    ax.loglog([4 * n for n in wall_sizes], np.array(real) * 1e6, "o-", color=color,
              label=f"{name}: this machine")
    ax.loglog([4 * n for n in wall_sizes], np.array(model) * 1e6, "--", color=color, alpha=0.6,
              label=f"{name}: model")
ring_real = np.array([max(w["ring", n] for w in walls) for n in wall_sizes])
design = np.array([[2 * (P - 1), 2 * (P - 1) / P * 4 * n] for n in wall_sizes])
(alpha_fit, beta_fit), *_ = np.linalg.lstsq(design, ring_real, rcond=None)
ax.set(xlabel="array size n (bytes)", ylabel="time per allreduce (us)")
ax.set_title(f"P = {P}: wall-clock here (solid) vs the alpha-beta model (dashed)", fontsize=10)
ax.legend(fontsize=7, ncol=2)
fig.tight_layout()
save_figure(fig, "05_wall_clock.png", dpi=110)
plt.close(fig)
print(f"ring fitted to this machine: alpha ~ {alpha_fit * 1e6:.0f} us, 1/beta ~ "
      f"{1 / max(beta_fit, 1e-15) / 1e9:.2f} GB/s "
      f"(model: {LINK.alpha * 1e6:.0f} us, {1 / LINK.beta / 1e9:.0f} GB/s)")

# %% [markdown]
# ## 7. How MPI chooses: `algorithm="auto"`
#
# MPICH's classic allreduce (`MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE` = 2048 bytes) uses recursive doubling
# up to 2048 bytes, or below the largest power of two ≤ P elements; otherwise Rabenseifner.
# `allreduce(..., algorithm="auto")` follows the same rule with the threshold tuned for minidist (a CVAR is
# a setting, meant to be tuned per machine): 512 KiB. Section 6 says why: a message costs minidist ten or
# more microseconds of Python, not MPICH's one, so Rabenseifner's log2 P extra messages pay only on far
# larger arrays (benchmarks/allreduce.md). Newer MPICH picks from tuning tables; NCCL uses rings and trees.
#
# Before that rule, minidist's `auto` asks whether the ranks share memory: the world communicator of the
# simulated cluster has a *shared area* (1 MiB per rank). An array that fits is reduced there without
# messages (`algorithm="shared_memory"`): each rank copies its input in, the ranks meet, and each adds its
# piece of every rank's array in rank order — one or two meetings instead of 2(P − 1) message steps, as
# MPICH and NCCL do inside one machine. Sub-communicators, MPI runs and Topologies have no area. Larger
# arrays go through a *window* (MPI's one-sided get and put) from 16 MiB on: each rank reads its piece
# straight out of the others' memory and writes the sum back into theirs while it is still in its cache.
# An array from `shared_empty(comm, shape, dtype)` lives in the shared memory itself, so its peers need
# no copy at all: that is how DataParallel's buckets are allocated (benchmarks/allreduce.md).

# %%
for nbytes in (8, 2048, 2052, 2**18, 2**20):
    print(f"{nbytes:8d} bytes on 8 ranks -> MPICH's default: "
          f"{choose_algorithm(nbytes, nbytes // 4, 8, short_bytes=MPICH_SHORT_MESSAGE_BYTES):18s} "
          f"minidist's: {choose_algorithm(nbytes, nbytes // 4, 8)}")
assert choose_algorithm(2048, 512, 8, short_bytes=MPICH_SHORT_MESSAGE_BYTES) == "recursive_doubling"
assert choose_algorithm(2052, 513, 8, short_bytes=MPICH_SHORT_MESSAGE_BYTES) == "rabenseifner"
assert choose_algorithm(2052, 513, 8) == "recursive_doubling"
assert choose_algorithm(2**20, 2**18, 8) == "rabenseifner"
assert choose_algorithm(2**20, 2**18, 8, shared_bytes=2**20) == "shared_memory"        # fits the area
assert choose_algorithm(2**20 + 4, 2**18 + 1, 8, shared_bytes=2**20) == "rabenseifner"  # does not
assert choose_algorithm(2**24, 2**22, 8, shared_bytes=2**20, windows=True) == "shared_memory"  # a window

# %% [markdown]
# ## 8. The eight collectives, before and after — and three more algorithms
#
# The tutorial's table on 4 ranks; rank r starts with x_r = 10(r + 1) (personalised ones send 10r + j
# to rank j). The naive allreduce of section 1 sends everyone everything, (P − 1)·n bytes;
# `pairwise_allreduce` makes the same direct exchanges but sends each peer only the piece it reduces
# (reduce-scatter, then allgather): the ring's 2(P − 1)/P·n. Bruck's allgather takes ⌈log2 P⌉ messages,
# not P − 1; the chain broadcast pipelines S segments, (P + S − 2)(α + nβ/S); the dissemination barrier
# sends ⌈log2 P⌉ empty messages (collectives/bruck.py, chain.py, dissemination.py; tested on the clock).


# %%
def before_and_after(comm):
    c, r, p, x = collectives, comm.rank, comm.world_size, np.array([10 * (comm.rank + 1)])
    mine = [np.array([10 * r + j]) for j in range(p)]
    out = {"broadcast": c.broadcast(comm, x), "reduce": c.reduce(comm, x), "gather": c.gather(comm, x),
           "scatter": c.scatter(comm, mine if r == 0 else None), "allgather": c.allgather(comm, x),
           "reduce_scatter": c.reduce_scatter(comm, np.arange(p) * x), "alltoall": c.alltoall(comm, mine),
           "allreduce": c.pairwise_allreduce(comm, x), "bruck_allgather": c.bruck_allgather(comm, x),
           "chain_broadcast": c.chain_broadcast(comm, x if r == 0 else None, segments=1)}
    c.dissemination_barrier(comm)
    return {k: None if v is None else np.concatenate(v if isinstance(v, list) else [v]).tolist()
            for k, v in out.items()}


after = run(before_and_after, 4)
print(f"{'before':16s}" + "".join(f"{str([10 * (r + 1)]):>18s}" for r in range(4)))
for op in after[0]:
    print(f"{op:16s}" + "".join(f"{str(after[r][op]):>18s}" for r in range(4)))
xs, only_root = [10, 20, 30, 40], [None] * 3
expected = {"broadcast": [[10]] * 4, "reduce": [[100], *only_root], "gather": [xs, *only_root],
            "scatter": [[r] for r in range(4)], "allgather": [xs] * 4,
            "reduce_scatter": [[100 * r] for r in range(4)],      # piece r of Σ_q [0, x_q, 2x_q, 3x_q]
            "alltoall": [[10 * j + r for j in range(4)] for r in range(4)], "allreduce": [[100]] * 4,
            "bruck_allgather": [xs] * 4, "chain_broadcast": [[10]] * 4}
assert list(expected) == list(after[0])
assert all([a[op] for a in after] == want for op, want in expected.items())
print("done: figures in", FIGURES)

# %% [markdown]
# ## Exercises
#
# * `ring_allreduce` — reduce-scatter then allgather around the ring, P − 1 steps each: send my chunk
#   right, receive from the left, add it in. Check: `python -m pytest --exercise ring_allreduce`.
# * `parameter_server_allreduce` — rank 0 receives every worker's array, sums, sends the total back.
#   Check: `python -m pytest --exercise parameter_server_allreduce`.
# * `tree_allreduce` — binomial-tree reduce to rank 0, then binomial-tree broadcast.
#   Check: `python -m pytest --exercise tree_allreduce`.
#
# Hint: `comm.sendrecv(x, dst, src, out=chunk, op="sum")` sends and receives in one step (no deadlock,
# whatever the size) and adds the incoming chunk into `out` on receipt; `comm.recv(src, out=, op=)` does
# the same for a plain receive. Chunk bounds follow `np.array_split` (collectives/pieces.py); the schedule
# figures above show every message.

# %%
# Check yourself (`python -m minidist exercises questions --lesson 05`): the answers, asserted.
slow = LinkModel(alpha=10e-6, beta=1e-9)
seconds = {a: [price(schedule(a, 8), 2**k // 4, 4, slow).time for k in range(30)] for a in ("ring", "tree")}
check_yourself("05", ring_bytes=price(schedule("ring", 6), 3_000_000, 4, slow).bytes_sent[0],
               server_bytes=price(schedule("parameter_server", 8), 1_000_000, 4, slow).bytes_sent[0],
               ring_beats_tree=next(2**k for k in range(30) if seconds["ring"][k] < seconds["tree"][k]))
