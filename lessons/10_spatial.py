# %% [markdown]
# # 10 — Spatial parallelism: convolutions split across accelerators with halo exchange
#
# **Goal.** Split one image across several accelerators, run a convolution on the pieces, and see
# exactly what must travel between them (the *halo*), what it costs, and when it stops paying.
#
# Source: slides "Distributed Deep Learning (Part II)", "Spatial Parallel Training" (Jin, Ginsburg & Keutzer,
# "Spatially Parallel Convolutions", ICLR workshop 2018; Gholami et al., SPAA 2018): "break the input
# into smaller pieces and distribute the work among different processors — need to exchange boundary
# points for spatial convolutions". The slides end: useful for high-resolution training, only effective
# for high resolution input data, and it limits the number of processors that can be used well.
#
# The library code: `minidist/parallel/spatial/partition.py` (the arithmetic), `comm.py` (the halo exchange),
# `spatial.py` (the layers), `cost.py` (the simulated clock at sizes too large to compute).

# %%
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.cluster import Device, LinkModel, run, run_traced
from minidist.collectives import sum_partial_gradients
from minidist.nn import Conv2d
from minidist.optim import SGD
from minidist.parallel.spatial import SpatialConv2d, grid_blocks
from minidist.parallel.spatial.cost import forward_time_1d, rehearse_conv_step
from minidist.parallel.spatial.partition import AxisPartition, HaloPlan, length
from minidist.sim.plots import figures_dir, plot_timeline, save_figure

FIGURES = figures_dir()  # figures/, or $MINIDIST_FIGURES (the tests use a temporary folder)
started = time.perf_counter()

# %% [markdown]
# ## 1. Partition the output, derive the input window
#
# Along one axis a layer with kernel k, stride s, padding p turns n_in rows into
# n_out = ⌊(n_in + 2p − k)/s⌋ + 1, and output row o reads input rows o·s − p … o·s − p + k − 1.
# We split the **output** evenly over the ranks; a rank computing output rows [o0, o1) then reads the
# input window [o0·s − p, (o1 − 1)·s − p + k). The input is split evenly too (it is the previous layer's
# output), so the halo is "window minus own rows" on each side. It can be lopsided, zero or negative:

# %%
for kernel, stride, padding in [(3, 1, 1), (5, 1, 2), (3, 2, 1), (1, 2, 0)]:
    axis = AxisPartition.build(16, kernel, stride, padding, parts=3)
    print(f"k={kernel} s={stride} p={padding}: out rows {axis.out}, own input rows {axis.own}")
    print(f"      windows {axis.window}, halo (before, after) per rank {[axis.halo(i) for i in range(3)]}")
axis = AxisPartition.build(16, 1, 2, 0, parts=3)
assert min(min(axis.halo(i)) for i in range(3)) < 0   # kernel 1, stride 2: rows nobody reads are trimmed

# %% [markdown]
# ## 2. The halo in two dimensions: 4 messages, not 8
#
# On a Ph × Pw grid the exchange runs one dimension at a time. Phase 0: full-width row slabs up and down
# the grid column. Phase 1: full-*height* column slabs (own rows plus the rows just received) left and
# right. The corner pieces ride along in phase 1, so an interior rank needs 4 messages, not 8. Below, the
# centre rank of a 3 × 3 grid on an 18 × 18 image: its own block (white), the rows that came in phase 0
# (blue) and the columns of phase 1 (orange; the corners inside them came from the diagonal ranks via
# their side neighbours).

# %%
fig, axes = plt.subplots(2, 2, figsize=(9, 9))
for ax, (kernel, stride) in zip(axes.flat, [(3, 1), (5, 1), (3, 2), (5, 2)]):
    plan = HaloPlan.build((18, 18), kernel, stride, kernel // 2, (3, 3))
    centre = 4
    (own_r, own_c), (win_r, win_c) = plan.own_block(centre), plan.window_block(centre)
    picture = np.zeros((18, 18))
    for t in plan.transfers:
        if t.dst == centre:
            picture[t.rows[0]:t.rows[1], t.cols[0]:t.cols[1]] = 1 + t.phase
    picture[own_r[0]:own_r[1], own_c[0]:own_c[1]] = 3
    cmap = matplotlib.colors.ListedColormap(["#eeeeee", "tab:blue", "tab:orange", "white"])
    ax.imshow(picture, cmap=cmap, vmin=-0.5, vmax=3.5)
    for edge in range(1, 3):   # the grid of ownership
        ax.axhline(plan.rows.own[edge][0] - 0.5, color="black", lw=1)
        ax.axvline(plan.cols.own[edge][0] - 0.5, color="black", lw=1)
    ax.add_patch(plt.Rectangle((win_c[0] - 0.5, win_r[0] - 0.5), length(win_c), length(win_r),
                               fill=False, ls="--", lw=2, color="red"))
    (ht, hb), (hl, hr) = plan.rows.halo(1), plan.cols.halo(1)
    sent, received = plan.halo_elements(centre)
    ax.set_title(f"{kernel}×{kernel}, stride {stride}: halo top {ht}, bottom {hb}, left {hl}, right {hr}\n"
                 f"{plan.messages(centre)[1]} messages in, {received} pixels per plane", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    if stride == 1:
        assert plan.messages(centre) == (4, 4)   # up, down, then left, right: corners included
fig.suptitle("centre rank of a 3×3 grid: own block (white), phase-0 rows (blue), phase-1 columns (orange);\n"
             "red dashes: the input window its output reads", fontsize=10)
fig.tight_layout()
save_figure(fig, "10_partition_halo.png", dpi=110)
print("wrote figures/10_partition_halo.png")

# %% [markdown]
# **Exercise `halo_exchange`.** In a student copy the body of `exchange_halo` in
# `minidist/parallel/spatial/comm.py` is cut out. Write it: copy the own rows into a buffer of the window's
# height, run the steps of `plan.steps(rank, phase=0)` with `shift_step` (each gives at most one slab to
# send and one to receive), then the same along W over full-height slabs of that buffer. Check it with
# `python -m pytest tests/parallel --exercise halo_exchange`.
#
# With stride 2 the halo is lopsided: a window starts at o0·s − p, on the stride's grid, while an input
# piece starts wherever the even split of the *input* puts it; the two splits do not line up.
#
# ## 3. The ledger against the formula
#
# Per (sample, channel) plane, a rank with own block h × w, window H_w × W_w (and overlaps h∩, w∩ of own
# and window) receives
#
#     (H_w − h∩)·w  (phase 0)  +  H_w·(W_w − w∩)  (phase 1)
#
# which is H_w·W_w − h·w, "window minus interior", when the window covers the block: (h + 2)(w + 2) − hw
# for an interior rank and a 3×3 conv with padding 1. Times N·C·(bytes per number). We run a real
# `SpatialConv2d` forward on the cluster and read the byte counters of every rank.

# %%
BATCH, CHANNELS, SIZE = 2, 8, (30, 34)


def forward_traffic(comm, grid, kernel):
    conv = Conv2d(CHANNELS, CHANNELS, kernel, padding=kernel // 2, rng=np.random.default_rng(0),
                  dtype=np.float32)
    layer = SpatialConv2d(conv, comm, grid, SIZE)
    rows, cols = grid_blocks(SIZE, grid)[comm.rank]
    x = np.random.default_rng(1).standard_normal((BATCH, CHANNELS, *SIZE), dtype=np.float32)
    layer.forward(np.ascontiguousarray(x[:, :, rows, cols]))
    return comm.stats.bytes_sent, comm.stats.bytes_received, comm.stats.messages_sent


print("grid  kernel  rank: bytes received (ledger = formula), messages sent")
for grid, kernel in [((4, 1), 3), ((2, 2), 3), ((2, 3), 5), ((2, 2), 1)]:
    plan = HaloPlan.build(SIZE, kernel, 1, kernel // 2, grid)
    ledger = run(forward_traffic, plan.world_size, grid, kernel)
    formula = [plan.halo_bytes(r, BATCH, CHANNELS, itemsize=4) for r in range(plan.world_size)]
    assert [(s, r) for s, r, _ in ledger] == formula
    assert [m for _, _, m in ledger] == [plan.messages(r)[0] for r in range(plan.world_size)]
    print(f"{grid[0]}x{grid[1]}   {kernel}x{kernel}   " +
          "  ".join(f"r{r}: {received} ({m} msg)" for r, (_, received, m) in enumerate(ledger)))
    if kernel == 1:
        assert all(received == 0 for _, received, _ in ledger)   # a 1×1 conv exchanges nothing
plan = HaloPlan.build(SIZE, 3, 1, 1, (2, 2))
h, w = 15, 17
assert plan.halo_bytes(0, BATCH, CHANNELS, 4)[1] == ((h + 1) * (w + 1) - h * w) * BATCH * CHANNELS * 4

# %% [markdown]
# ## 4. Halo-to-interior ratio: why high resolution
#
# A rank computes on its interior (∝ area) and communicates its boundary (∝ perimeter). For an n × n
# image and a 3×3 conv: a 1-D split of P strips gives an interior rank 2n halo pixels for n²/P interior
# ones, ratio 2P/n; a √P × √P grid gives (n/√P + 2)² − (n/√P)² for (n/√P)², ratio ≈ 4√P/n. Doubling the
# resolution halves the ratio; more ranks raise it. The 2-D grid grows as √P, the strips as P: 64 ranks
# on an 8 × 8 grid pay about what 16 strips pay.

# %%
resolutions = np.array([32, 64, 128, 256, 512, 1024])
fig, ax = plt.subplots(figsize=(7, 4.5))
for ranks, grid2d in [(4, (2, 2)), (16, (4, 4)), (64, (8, 8))]:
    for grid, style in [((ranks, 1), "-"), (grid2d, "--")]:
        ratios, sides = [], [n for n in resolutions if n >= grid[0]]   # at least one row per rank
        for n in sides:
            plan = HaloPlan.build((int(n), int(n)), 3, 1, 1, grid)
            worst = max(range(ranks), key=lambda r: plan.halo_elements(r)[1])
            (own_r, own_c) = plan.own_block(worst)
            ratios.append(plan.halo_elements(worst)[1] / (length(own_r) * length(own_c)))
        ax.loglog(sides, ratios, style, marker="o", label=f"P={ranks}, grid {grid[0]}×{grid[1]}")
        if grid == (4, 1):
            assert np.allclose(ratios, 2 * 4 / resolutions)   # 2P/n
ax.set_xlabel("image side n (pixels)")
ax.set_ylabel("halo / interior (busiest rank)")
ax.set_title("3×3 conv: halo-to-interior ratio (solid: 1-D strips, dashed: 2-D grid)")
ax.legend(fontsize=8)
ax.grid(True, which="both", alpha=0.3)
fig.tight_layout()
save_figure(fig, "10_halo_ratio.png", dpi=110)
print("wrote figures/10_halo_ratio.png")

# %% [markdown]
# ## 5. Scaling on the simulated clock, beside the slides' V100 measurements
#
# The slides measure a 3×3 conv, batch 32, 64 channels, on 1, 2 and 4 V100s:
#
# | resolution | forward, 1 / 2 / 4 GPUs (speedup)    | backward, 1 / 2 / 4 GPUs (speedup)     |
# |------------|--------------------------------------|----------------------------------------|
# | 128²       | 2.56 / 1.52 / 1.23 ms (1.7×, 2.1×)   | 6.63 / 3.50 / 2.33 ms (1.9×, 2.8×)     |
# | 256²       | 10.02 / 5.34 / 3.11 ms (1.9×, 3.2×)  | 26.81 / 11.79 / 6.96 ms (2.3×, 3.9×)   |
# | 512²       | 45.15 / 20.18 / 10.65 ms (2.2×, 4.2×) | 126.11 / 60.15 / 26.76 ms (2.1×, 4.7×) |
#
# We cannot compute a 512² step here (600 GFLOP forward), and we need not: the cluster's clock charges
# F / R for F FLOPs on a device of R FLOP/s (default: a V100, 15.7 TFLOP/s in FP32) and α + n·β per
# message (default α = 5 µs, β = 1/25 GB/s), whatever the numbers are. `rehearse_conv_step` walks the
# real halo schedule with zero slabs of the real sizes, charges the local conv's FLOPs with
# `comm.compute`, and allreduces a real weight-gradient-sized buffer. **The times below are this model's,
# not measurements.** First we check the rehearsal against a real `SpatialConv2d` at a size we can run.

# %%
def real_and_rehearsed(comm, size):
    conv = Conv2d(4, 4, 3, padding=1, rng=np.random.default_rng(0), dtype=np.float32)
    layer = SpatialConv2d(conv, comm, (comm.world_size, 1), (size, size))
    rows, cols = grid_blocks((size, size), (comm.world_size, 1))[comm.rank]
    x = np.ones((2, 4, size, size), np.float32)[:, :, rows, cols]
    start = comm.clock
    y = layer.forward(np.ascontiguousarray(x))
    middle = comm.clock
    layer.backward(np.ones_like(y))
    sum_partial_gradients(layer.parameters(), algorithm="ring")   # the weight gradient, summed over the grid
    real = (middle - start, comm.clock - middle)
    comm.barrier()
    return real, rehearse_conv_step(comm, layer.plan, 2, 4, 4, dtype=np.float32)


for real, rehearsed in run(real_and_rehearsed, 2, 40):
    assert np.allclose(real, rehearsed, rtol=1e-12), (real, rehearsed)
print("rehearsal == real SpatialConv2d on the simulated clock (forward, backward)")

# %% [markdown]
# The weight gradient each rank computes covers only its block of the image: `SpatialConv2d` (and
# `spatialize`) mark the conv's parameters *partial* over the grid (`p.partial_over`), and
# `sum_partial_gradients(model.parameters())` is the one call that sums them. It is not optional: the
# backward's `p.grad += dW` marks a partial gradient pending, and every optimizer refuses to step on it
# until the sum has run.


# %%
def step_without_and_with_the_sum(comm):
    conv = Conv2d(4, 4, 3, padding=1, rng=np.random.default_rng(0), dtype=np.float64)
    layer = SpatialConv2d(conv, comm, (comm.world_size, 1), (8, 8))
    rows, cols = grid_blocks((8, 8), (comm.world_size, 1))[comm.rank]
    layer.backward(np.ones_like(layer.forward(np.ones((1, 4, 8, 8))[:, :, rows, cols])))
    optimizer, refused = SGD(conv.parameters(), lr=0.1), None
    try:
        optimizer.step()
    except ValueError as refusal:
        refused = str(refusal)
    sum_partial_gradients(conv.parameters())   # the whole gradient on every rank
    optimizer.step()                           # accepted now
    return refused


refused = run(step_without_and_with_the_sum, 2)[0]
print(refused)
assert refused is not None and "params[0] (shape (4, 4, 3, 3))" in refused and "partial gradient" in refused

SLIDES_FWD = {128: (2.56, 1.52, 1.23), 256: (10.02, 5.34, 3.11), 512: (45.15, 20.18, 10.65)}
SLIDES_BWD = {128: (6.63, 3.50, 2.33), 256: (26.81, 11.79, 6.96), 512: (126.11, 60.15, 26.76)}
RANKS = (1, 2, 4)


def rehearse_all(comm):
    return {n: rehearse_conv_step(comm, HaloPlan.build((n, n), 3, 1, 1, (comm.world_size, 1)), 32, 64, 64)
            for n in SLIDES_FWD}


model = {}   # (n, P) -> (forward s, backward s), the slowest rank
for ranks in RANKS:
    per_rank = run(rehearse_all, ranks)
    for n in SLIDES_FWD:
        model[n, ranks] = tuple(max(r[n][i] for r in per_rank) for i in (0, 1))
link, device = LinkModel(), Device()
print("\nresolution  P   model fwd (speedup)    V100 fwd          model bwd (speedup)    V100 bwd")
for n in SLIDES_FWD:
    for k, ranks in enumerate(RANKS):
        fwd, bwd = model[n, ranks]
        f1, b1 = model[n, 1]
        print(f"{n:4d}²      {ranks}   {fwd * 1e3:7.2f} ms ({f1 / fwd:.2f}×)   "
              f"{SLIDES_FWD[n][k]:6.2f} ms ({SLIDES_FWD[n][0] / SLIDES_FWD[n][k]:.1f}×)   "
              f"{bwd * 1e3:7.2f} ms ({b1 / bwd:.2f}×)   "
              f"{SLIDES_BWD[n][k]:6.2f} ms ({SLIDES_BWD[n][0] / SLIDES_BWD[n][k]:.1f}×)")
        assert np.isclose(fwd, forward_time_1d(n, n, 3, ranks, 32, 64, link.alpha, link.beta, device.flops),
                          rtol=1e-9)
speedup4 = [model[n, 1][0] / model[n, 4][0] for n in SLIDES_FWD]
assert speedup4 == sorted(speedup4)   # the same trend as the slides: higher resolution scales better

fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
for ax, which, slides in [(axes[0], 0, SLIDES_FWD), (axes[1], 1, SLIDES_BWD)]:
    for n, color in zip(SLIDES_FWD, ["tab:blue", "tab:orange", "tab:green"]):
        ax.plot(RANKS, [model[n, 1][which] / model[n, p][which] for p in RANKS], "-o", color=color,
                label=f"{n}² model")
        ax.plot(RANKS, [slides[n][0] / t for t in slides[n]], ":s", color=color, label=f"{n}² V100 (slides)")
    ax.plot(RANKS, RANKS, color="gray", lw=0.8, label="ideal")
    ax.set_xlabel("accelerators")
    ax.set_title(("forward" if which == 0 else "backward") + ": 3×3 conv, batch 32, 64 channels")
    ax.set_xticks(RANKS)
axes[0].set_ylabel("speedup over 1 accelerator")
axes[1].legend(fontsize=7)
fig.tight_layout()
save_figure(fig, "10_scaling.png", dpi=110)
print("wrote figures/10_scaling.png")

# %% [markdown]
# One rehearsed step at 64² on 4 ranks, drawn from the cluster's trace: two halo shifts (down, then
# up), the forward conv, the backward conv (twice the FLOPs), the halo gradients going home, and the
# ring allreduce of the weight gradient. At this low resolution the messages are already a visible
# slice of the step.

# %%
def rehearse_64(comm):
    return rehearse_conv_step(comm, HaloPlan.build((64, 64), 3, 1, 1, (comm.world_size, 1)), 32, 64, 64)


_, trace = run_traced(rehearse_64, 4)
ax = plot_timeline(trace, title="one rehearsed step: 3×3 conv, 64², batch 32, 64 channels, 4 ranks")
ax.figure.tight_layout()
save_figure(ax.figure, "10_timeline.png", dpi=110)
sends = [s for s in trace.spans if s.kind == "send" and s.rank == 1]
assert len(sends) >= 4   # an interior rank: 2 halo slabs forward, 2 gradients back (+ the allreduce)
print("wrote figures/10_timeline.png")

# %% [markdown]
# The model shows the slides' trend (higher resolution scales better) but is more optimistic, most of
# all at 128². It charges a fixed FLOP rate; a real GPU runs a quarter-size convolution at lower
# efficiency (fewer thread blocks to fill 80 SMs, fixed kernel-launch costs), and that is missing here.
# Some backward numbers of the slides even beat the ideal (4.7× on 4 GPUs): smaller pieces fit caches
# better — another effect a FLOP-rate model cannot show.
#
# ## 6. Where spatial parallelism stops paying
#
# For a 1-D split the forward costs T(P) = 2(α + r·n·N·C·b·β) + F/(P·R): the compute shrinks with P, the
# halo does not. Efficiency T(1) / (P·T(P)) falls as P grows and falls sooner at low resolution.
# (`forward_time_1d` is the formula; section 5 asserted it equals the rehearsed clock.)

# %%
fig, ax = plt.subplots(figsize=(7, 4.5))
ranks_axis = [1, 2, 4, 8, 16, 32, 64]
print("\nresolution: largest P (power of 2) with forward efficiency >= 50%")
largest = []
for n in [32, 64, 128, 256, 512]:
    t1 = forward_time_1d(n, n, 3, 1, 32, 64, link.alpha, link.beta, device.flops)
    usable = [p for p in ranks_axis if n // p >= 1]
    eff = [t1 / (p * forward_time_1d(n, n, 3, p, 32, 64, link.alpha, link.beta, device.flops))
           for p in usable]
    ax.semilogx(usable, eff, "-o", base=2, label=f"{n}²")
    best = max(p for p, e in zip(usable, eff) if e >= 0.5)
    largest.append(best)
    print(f"  {n:4d}²: P = {best:2d}   (efficiency at P=4: {eff[2]:.2f})")
assert largest == sorted(largest) and largest[-1] >= 16 * largest[0]   # higher resolution, more ranks
ax.axhline(0.5, color="gray", ls="--", lw=0.8)
ax.set_xticks(ranks_axis, [str(p) for p in ranks_axis])
ax.set_xlabel("accelerators P (1-D split)")
ax.set_ylabel("forward efficiency T(1) / (P·T(P))")
ax.set_title("3×3 conv, batch 32, 64 channels, V100 model: where the halo eats the gain")
ax.legend()
fig.tight_layout()
save_figure(fig, "10_efficiency.png", dpi=110)
print("wrote figures/10_efficiency.png")

# %% [markdown]
# **What to take away.** Spatial parallelism splits the work of *one* sample, so it helps where data
# parallelism cannot: huge images, batch too small to split. Its communication is a thin boundary per
# layer (plus the usual weight-gradient allreduce), cheap while pieces are thick. It stops paying when
# the pieces get thin — low resolution or many ranks — exactly the slides' "only effective for high
# resolution input data; limits the number of processors that can be effectively utilized".

# %%
elapsed = time.perf_counter() - started
print(f"\nlesson ran in {elapsed:.1f} s")

# %% [markdown]
# ## Exercises
#
# * `halo_exchange` — `exchange_halo(comm, x_local, plan)`: fill this rank's input window from its
#   own block and the neighbours' boundary slabs, rows first (`plan.steps(rank, phase=0)`), then
#   columns (`phase=1`). Check: `python -m pytest --exercise halo_exchange`.
#
# Hint: one `comm.sendrecv(slab, dst, src, sendtag=, recvtag=)` per step (`shift_step` wraps it): a
# shift never deadlocks, whatever the slab size.
