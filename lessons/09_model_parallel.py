# %% [markdown]
# # 09 — Model parallelism: splitting each layer's weights across accelerators
#
# **Goal.** Data parallelism copies the whole model onto every accelerator and splits the batch. Model
# (intra-layer, "operator" or "tensor") parallelism does the opposite: it splits every layer's *weights*
# across the P accelerators and gives each of them the whole batch. This lesson
#
# 1. draws the two ways to cut a Linear layer's weight, and Megatron's pairing of them;
# 2. checks on a cluster of processes that the shards compute exactly what one process computes;
# 3. measures, with the cluster's ledger, the bytes moved per training step by model, data and hybrid
#    parallelism over a sweep of layer widths d and batch sizes B, and lays them over the slides' formulas;
# 4. finds the crossover where model parallelism moves fewer bytes (d ≫ B);
# 5. compares the memory each accelerator needs — when the model does not fit on one device, data
#    parallelism is not an option at all.
#
# Source: the slides "Distributed Deep Learning (Part II)" ("Model Parallelism: Weights", "Communication
# Complexity Analysis", "Model vs Data Parallelism?"), with the memory argument of
# the HOT CHIPS tutorial write-up and the slides "Scaling Up Training".

# %%

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.cluster import Device, run
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD
from minidist.parallel import Mesh
from minidist.parallel.grids import hybrid_train_step, mesh_bytes_sent
from minidist.parallel.tensor import MegatronMLP, column_parallel_mlp, megatron_parallel_mlp
from minidist.parallel.tensor.comm import feature_bounds
from minidist.parallel.tensor.cost import (
    column_parallel_words,
    data_parallel_words,
    hybrid_words,
    megatron_words,
    memory_words_per_device,
    seed_t_comm_data,
    seed_t_comm_model,
)
from minidist.sim.plots import figures_dir, save_figure
from minidist_course.questions import check_yourself

FIGURES = figures_dir()  # figures/, or $MINIDIST_FIGURES (the tests use a temporary folder)

# %% [markdown]
# ## 1. Two ways to cut a Linear layer
#
# A Linear layer computes y = x·Wᵀ with W of shape (out, in). With P ranks:
#
# * **column-parallel** (split the *output* features): rank p keeps rows W[rows_p, :] and computes its own
#   columns of y from the whole x. To give every rank the whole y, the slices are **all-gathered** — the
#   slides' forward pass. Backward, each rank can form dx only partially, dx = Σ_p dy_p·W_p, so the input
#   gradient needs an **all-reduce** — the slides' backward pass.
# * **row-parallel** (split the *input* features): rank p keeps columns W[:, cols_p] and sees only
#   x[:, cols_p]; its product is a *partial sum*, and y = Σ_p x_p·W_pᵀ needs an all-reduce.
#
# Megatron-LM (Shoeybi et al., 2019) puts a column-parallel layer *in front of* a row-parallel one: the
# column layer's output slice is exactly the row layer's input slice, so the activation between them never
# moves. The whole MLP block then needs one all-reduce forward (operator g) and one backward (operator f).
# The HOT CHIPS tutorial write-up calls this "alternating between horizontal and vertical partitions".
#
# The split follows `np.array_split`, so widths that P does not divide work too: below, 10 hidden units on
# 3 ranks get 4, 3 and 3.

# %%
P_DRAW, D_IN, HIDDEN = 3, 7, 10
colors = plt.cm.Set2(np.arange(P_DRAW))


def owner_map(n_rows, n_cols, bounds, axis):
    """An image whose pixel (i, j) is the rank that owns W[i, j]."""
    owner = np.zeros((n_rows, n_cols), int)
    for rank, (lo, hi) in enumerate(bounds):
        if axis == 0:
            owner[lo:hi, :] = rank
        else:
            owner[:, lo:hi] = rank
    return owner


hidden_bounds = feature_bounds(HIDDEN, P_DRAW)
panels = [
    ("column-parallel W₁ (hidden × d):\nrank p owns rows (output features)",
     owner_map(HIDDEN, D_IN, hidden_bounds, 0)),
    ("row-parallel W₂ (d × hidden):\nrank p owns columns (input features)",
     owner_map(D_IN, HIDDEN, hidden_bounds, 1)),
]
fig, axes = plt.subplots(1, 3, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1, 1.3, 1.5]})
cmap = matplotlib.colors.ListedColormap(colors)
for ax, (title, owner) in zip(axes[:2], panels):
    ax.imshow(owner, cmap=cmap, vmin=-0.5, vmax=P_DRAW - 0.5)
    ax.set_title(title, fontsize=10)
    ax.set_xticks([]), ax.set_yticks([])
    for (i, j), rank in np.ndenumerate(owner):
        ax.text(j, i, str(rank), ha="center", va="center", fontsize=7)
ax = axes[2]
ax.axis("off")
ax.set_xlim(0, 10), ax.set_ylim(0, 10)
steps = [(9, "x  (N × d), whole on every rank"), (7.6, "f: forward identity · backward ALL-REDUCE"),
         (6.2, "a_p = ReLU(x·W₁,pᵀ + b₁,p)   (N × hidden_p)"),
         (4.8, "z_p = a_p·W₂,pᵀ   partial sums (N × d)"),
         (3.4, "g: forward ALL-REDUCE · backward identity"), (2.0, "z = Σ_p z_p + b₂  (N × d), whole")]
for y, text in steps:
    bold = "ALL-REDUCE" in text
    ax.text(0.2, y, text, fontsize=9, weight="bold" if bold else "normal", color="firebrick" if bold else "k")
    if y > 2.0:
        ax.annotate("", (1.0, y - 1.05), (1.0, y - 0.35), arrowprops={"arrowstyle": "->"})
ax.set_title("the Megatron MLP block on rank p", fontsize=10)
fig.suptitle(f"Weight partitions over P = {P_DRAW} ranks (hidden = {HIDDEN} units → "
             f"{[hi - lo for lo, hi in hidden_bounds]} per rank)")
fig.tight_layout()
save_figure(fig, "09_partitions.png", dpi=110)
plt.close(fig)
print("hidden units per rank:", [hi - lo for lo, hi in hidden_bounds])

# %% [markdown]
# ## 2. The shards compute what one process computes
#
# Every rank builds the *same* full MLP from the same seed and keeps only its slice, so we can compare. One
# Megatron block on 3 ranks, float64: its output and input gradient equal the single-process block's, and
# each rank's weight gradients are the slices of the single-process gradients.


# %%
def make_mlp(widths, bias=False, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    layers = []
    for i in range(1, len(widths)):
        layers += [Linear(widths[i - 1], widths[i], bias, rng=rng, dtype=dtype), ReLU()]
    return Sequential(*layers[:-1])


def megatron_check(comm, widths, batch):
    full = make_mlp(widths, bias=True)
    block = MegatronMLP(comm, full[0], full[2], input_grad=True)
    rng = np.random.default_rng(1)
    x, dz = rng.standard_normal((batch, widths[0])), rng.standard_normal((batch, widths[-1]))
    return block(x), block.backward(dz), block.up.weight.grad, block.up.rows


check_widths, check_batch = [6, HIDDEN, 5], 4
results = run(megatron_check, P_DRAW, check_widths, check_batch)
reference = make_mlp(check_widths, bias=True)
rng = np.random.default_rng(1)
x, dz = rng.standard_normal((check_batch, 6)), rng.standard_normal((check_batch, 5))
z_ref, dx_ref = reference(x), reference.backward(dz)
worst = 0.0
for z, dx, dw1, rows in results:
    worst = max(worst, np.abs(z - z_ref).max(), np.abs(dx - dx_ref).max(),
                np.abs(dw1 - reference[0].weight.grad[rows]).max())
print(f"Megatron block on {P_DRAW} ranks vs one process: largest difference {worst:.1e}")
assert worst < 1e-12

# %% [markdown]
# ## 3. Bytes per training step: model vs data vs hybrid, measured
#
# The Part II slides count the traffic of one step of an L-layer network of widths d_i (batch B, P ranks,
# β seconds per word):
#
# T_comm(model) = Σ_{i=1..L} β(P−1)·B·d_i/P  +  2·Σ_{i=2..L} β(P−1)·B·d_i/P   (all-gather + all-reduce)
#
# T_comm(data)  = Σ_{i=1..L} β(P−1)·d_i²/P
#
# We train one step of an MLP of L = 4 square d×d layers (float32, no biases — the slides count weights
# only) on a cluster of P = 4 ranks, for each d and B, in four ways:
#
# * **model (slides)** — every layer column-parallel, outputs all-gathered (`column_parallel_mlp`);
# * **model (Megatron)** — two blocks of column + row layers (`megatron_parallel_mlp`);
# * **data** — every rank a whole copy, B/4 samples each, gradients all-reduced (`Mesh(comm, data=4)`);
# * **hybrid** — `Mesh(comm, data=2, tensor=2)`: the slides' model parallelism inside each tensor pair,
#   data parallelism across the pairs.
#
# Each is one `Mesh` and one step, `hybrid_train_step(mesh, model, ...)` (minidist/parallel/grids/: the
# step of a model built of tensor-parallel layers; `parallelize` splits GPTs): the model runs on the
# mesh's tensor group with its data group's slice of the batch, and the data group sums the gradients.
#
# The cluster's ledger counts the payload bytes each rank sends (`comm.stats.bytes_sent`). Every rank sends
# the same amount here, so one rank's bytes are the measurement.

# %%
P, LAYERS, ITEMSIZE = 4, 4, 4
D_SWEEP = [8, 32, 128, 512]
B_SWEEP = [8, 32, 128]
STRATEGIES = ["model (slides)", "model (Megatron)", "data", "hybrid 2×2"]


def sweep(comm, d_sweep, b_sweep, layers):
    """On each rank: {(strategy, d, B): bytes sent in one step}, {(strategy, d): weights held}."""
    tensor_only, data_only = Mesh(comm, tensor=comm.world_size), Mesh(comm, data=comm.world_size)
    meshes = {"model (slides)": tensor_only, "model (Megatron)": tensor_only, "data": data_only,
              "hybrid 2×2": Mesh(comm, data=comm.world_size // 2, tensor=2)}
    builders = {"model (slides)": column_parallel_mlp, "model (Megatron)": megatron_parallel_mlp,
                "data": lambda group, full: full,  # data parallelism: the whole model on every rank
                "hybrid 2×2": column_parallel_mlp}
    measured, weights = {}, {}
    for d in d_sweep:
        for name in STRATEGIES:
            mesh = meshes[name]
            model = builders[name](mesh.group("tensor"), make_mlp([d] * (layers + 1), dtype=np.float32))
            opt = SGD(model.parameters(), lr=0.01)
            weights[name, d] = sum(p.size for p in model.parameters())
            for b in b_sweep:
                rng = np.random.default_rng(d * 1000 + b)
                x, labels = rng.standard_normal((b, d)).astype(np.float32), rng.integers(0, d, b)
                before = mesh_bytes_sent(mesh)
                hybrid_train_step(mesh, model, CrossEntropyLoss(), opt, x, labels)
                measured[name, d, b] = mesh_bytes_sent(mesh) - before
    return measured, weights


per_rank = run(sweep, P, D_SWEEP, B_SWEEP, LAYERS, timeout=120.0)
measured = per_rank[0][0]
assert all(r[0] == measured for r in per_rank), "every rank sends the same number of bytes here"


def predicted_words(name, d, b):
    """What the code sends per rank (exact), from minidist.parallel.tensor.cost."""
    widths = [d] * (LAYERS + 1)
    if name == "model (slides)":
        return column_parallel_words(widths, b, P) / P
    if name == "model (Megatron)":
        return megatron_words(widths, b, P) / P
    if name == "data":
        return data_parallel_words(LAYERS * d * d, P) / P
    shard = LAYERS * d * d // 2  # hybrid: tensor groups of 2 ranks, data groups of 2
    return hybrid_words(column_parallel_words(widths, b, 2), [shard, shard], 2) / P


for (name, d, b), nbytes in measured.items():
    assert nbytes == ITEMSIZE * predicted_words(name, d, b), (name, d, b)
    widths = [d] * (LAYERS + 1)
    if name == "model (slides)":
        assert nbytes == ITEMSIZE * seed_t_comm_model(widths, b, P)  # the seed's formula, to the byte
    if name == "data":
        assert nbytes == 2 * ITEMSIZE * seed_t_comm_data(widths, P)  # twice the seed's formula (see below)
print(f"all {len(measured)} measurements equal the formulas exactly, e.g. d = 512, B = 32:")
for name in STRATEGIES:
    print(f"    {name:17s} {measured[name, 512, 32]:>10,d} bytes per rank per step")

# %% [markdown]
# **The factor 2.** The Part II "Model vs Data" slide writes T_comm(data) = Σ β(P−1)·d_i²/P, but its own
# data-parallel slide has T_comm(batch) = 2·Σ(α(P−1) + β(P−1)/P·|W_i|): a ring all-reduce is a
# reduce-scatter *and* an all-gather, each moving (P−1)/P·|W| per rank. The ledger sees the 2: data
# parallelism's bytes are exactly twice the comparison slide's formula. (The model-parallel formula already
# counts its all-reduce with the 2.) Megatron's block moves less than the slides' scheme: its hidden
# activations never leave their rank.

# %%
fig, axes = plt.subplots(1, len(B_SWEEP), figsize=(14, 5), sharey=True)
marks = {"model (slides)": "o", "model (Megatron)": "s", "data": "^", "hybrid 2×2": "D"}
d_fine = np.arange(D_SWEEP[0], D_SWEEP[-1] + 1)
for ax, b in zip(axes, B_SWEEP):
    slides_model = [ITEMSIZE * seed_t_comm_model([d] * (LAYERS + 1), b, P) for d in d_fine]
    slides_data = [ITEMSIZE * seed_t_comm_data([d] * (LAYERS + 1), P) for d in d_fine]
    ax.plot(d_fine, slides_model, "C0-", lw=1, label="slides' T_comm(model)/β")
    ax.plot(d_fine, slides_data, "C2--", lw=1, label="slides' T_comm(data)/β")
    ax.plot(d_fine, 2 * np.array(slides_data), "C2-", lw=1, label="2 × slides' T_comm(data)/β (ring)")
    for k, name in enumerate(STRATEGIES):
        ax.plot(D_SWEEP, [measured[name, d, b] for d in D_SWEEP], marks[name], color=f"C{[0, 1, 2, 4][k]}",
                ms=6, mfc="none", label=f"measured: {name}")
    ax.set_xscale("log", base=2), ax.set_yscale("log")
    ax.set_title(f"B = {b}")
    ax.set_xlabel("layer width d")
    ax.grid(alpha=0.3)
axes[0].set_ylabel(f"bytes sent per rank per step (P = {P}, L = {LAYERS})")
handles, labels = axes[0].get_legend_handles_labels()
fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
fig.suptitle("Communication per step: the ledger's bytes (markers) over the slides' T_comm (lines)")
fig.tight_layout(rect=(0, 0.12, 1, 1))
save_figure(fig, "09_bytes_per_step.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ## 4. The crossover: model parallelism wins when d ≫ B
#
# For L square layers the slides' scheme sends (P−1)/P·B·d·(3L−2) words per rank and data parallelism
# 2(P−1)/P·L·d², so model parallelism sends less once d > (3L−2)/(2L)·B — here d > 1.25·B (with the
# comparison slide's formula, without the 2, the line would sit at 2.5·B). Megatron (3 all-reduces of B·d
# for two blocks) wins from d > 0.75·B. Model-parallel traffic grows like B·d, data-parallel like d²: wide
# layers with modest batches favour splitting the weights, small layers with big batches favour
# splitting the batch — and the hybrid sits in between.

# %%
for b in B_SWEEP:
    wins = [d for d in D_SWEEP if measured["model (slides)", d, b] < measured["data", d, b]]
    crossover = (3 * LAYERS - 2) / (2 * LAYERS) * b
    assert wins == [d for d in D_SWEEP if d > crossover], (b, wins)
    print(f"B = {b:3d}: the slides' model parallelism sends fewer bytes than data parallelism for d in {wins}"
          f"  (theory: d > {crossover:g})")

fig, ax = plt.subplots(figsize=(6.8, 5))
b_grid = np.geomspace(4, 256, 200)
ax.fill_between(b_grid, (3 * LAYERS - 2) / (2 * LAYERS) * b_grid, 1024, color="C0", alpha=0.12,
                label="model (slides) sends less than data")
ax.plot(b_grid, (3 * LAYERS - 2) / (2 * LAYERS) * b_grid, "C0-", label="measured crossover d = 1.25·B")
ax.plot(b_grid, (3 * LAYERS - 2) / LAYERS * b_grid, "C0:", label="slides' formulas: crossover d = 2.5·B")
ax.plot(b_grid, 0.75 * b_grid, "C1--", label="Megatron vs data: d = 0.75·B")
for d in D_SWEEP:
    for b in B_SWEEP:
        slides_win = measured["model (slides)", d, b] < measured["data", d, b]
        ax.plot(b, d, "o" if slides_win else "^", color="C0" if slides_win else "C2", ms=9)
        if measured["model (Megatron)", d, b] < measured["data", d, b]:
            ax.plot(b, d, "s", color="C1", ms=15, mfc="none")
ax.plot([], [], "o", color="C0", label="measured: model (slides) < data")
ax.plot([], [], "^", color="C2", label="measured: data < model (slides)")
ax.plot([], [], "s", color="C1", mfc="none", ms=10, label="measured: Megatron < data")
ax.set_xscale("log", base=2), ax.set_yscale("log", base=2)
ax.set_xlim(4, 256), ax.set_ylim(4, 1024)
ax.set_xlabel("batch size B"), ax.set_ylabel("layer width d")
ax.set_title(f"Model vs data parallelism: bytes per step (P = {P}, L = {LAYERS})")
ax.legend(fontsize=7, loc="lower right")
fig.tight_layout()
save_figure(fig, "09_crossover.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ## 5. Memory per accelerator: when data parallelism is not an option
#
# Bytes moved are only half the story. Data parallelism keeps the whole model on every device: weights,
# gradients, and the optimizer's state — "2–6× as much memory as the model itself" (HOT CHIPS write-up) — plus
# the activations kept for backward. Splitting the weights M ways divides the first three by M. "Not being
# able to fit the model in a single server is a hard limit for data-parallel" (same write-up).
#
# The ledger run above already shows the weights per rank: the slides' scheme keeps a quarter of each layer
# on each of the 4 ranks, the hybrid half, data parallelism all of it.

# %%
weights = per_rank[0][1]
for d in D_SWEEP:
    full_words = LAYERS * d * d
    assert weights["data", d] == full_words
    assert weights["model (slides)", d] == weights["model (Megatron)", d] == full_words // P
    assert weights["hybrid 2×2", d] == full_words // 2
print(f"weights per rank at d = 512: data {weights['data', 512]:,}, hybrid {weights['hybrid 2×2', 512]:,}, "
      f"model {weights['model (slides)', 512]:,}")

# %% [markdown]
# Now at scale: L = 24 square layers, fp32 weights and gradients with Adam's two moments (16 bytes per
# parameter), B = 64, on P = 8 devices of the cluster's default `Device()` — a V100 with 16 GiB ("Hardware
# Accelerators" tutorial). (The "Scaling Up Training" slides' "175B parameters @ fp16 = 316.2 GB" is
# an arithmetic slip: 175·10⁹ × 2 bytes = 350 GB = 326 GiB, which is still far beyond an 80 GB A100.)

# %%
device_gib = Device().memory / 2**30
L_BIG, B_BIG, P_BIG = 24, 64, 8
layouts = {"data (8 × 1)": (8, 1), "hybrid (2 × 4)": (2, 4), "model (1 × 8)": (1, 8)}
d_big = np.array([1024, 2048, 4096, 8192, 12288, 16384, 24576, 32768])
memory = {name: np.array([memory_words_per_device([d] * (L_BIG + 1), B_BIG, dp, tp,
                                                  optimizer_states=2)["total"]
                          for d in d_big]) * 4 / 2**30 for name, (dp, tp) in layouts.items()}
largest_fit = {name: d_big[gib <= device_gib].max() for name, gib in memory.items()}
for name, gib in memory.items():
    print(f"{name:15s} GiB per device: " + ", ".join(f"{g:7.1f}" for g in gib)
          + f"   largest d that fits {device_gib:.0f} GiB: {largest_fit[name]}")
assert largest_fit["data (8 × 1)"] < largest_fit["hybrid (2 × 4)"] < largest_fit["model (1 × 8)"]

fig, ax = plt.subplots(figsize=(7, 4.5))
for k, (name, gib) in enumerate(memory.items()):
    ax.plot(d_big, gib, "o-", color=f"C{[2, 4, 0][k]}", label=name)
ax.axhline(device_gib, color="firebrick", ls="--", label=f"one device: {device_gib:.0f} GiB (V100)")
ax.fill_between(d_big, device_gib, max(g.max() for g in memory.values()) * 1.5, color="firebrick", alpha=0.07)
ax.set_xscale("log", base=2), ax.set_yscale("log")
ax.set_xlabel("layer width d"), ax.set_ylabel("memory per device (GiB)")
ax.set_title(f"Weights + grads + Adam + activations, L = {L_BIG}, B = {B_BIG}, P = {P_BIG}")
ax.legend(fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()
save_figure(fig, "09_memory.png", dpi=110)
plt.close(fig)

# %% [markdown]
# **What to remember.** Model parallelism trades the d² all-reduce of data parallelism for per-layer
# all-gathers and all-reduces of B·d activations: it pays off for wide layers and modest batches (here
# d > 1.25·B for the slides' scheme, d > 0.75·B for Megatron's), and it is the only way to train a model whose
# weights and optimizer state do not fit on one device. In practice the two are combined on a grid of ranks
# (Gholami et al., 2018): model parallelism inside a group of closely connected devices, data parallelism
# across groups.

# %% [markdown]
# ## Exercises
#
# * `megatron_mlp` — `MegatronMLP.forward` / `.backward`: column-parallel first layer, element-wise
#   activation, row-parallel second layer; one all-reduce forward (`self.g.forward`) and one backward
#   (`self.f.backward`). Check: `python -m pytest --exercise megatron_mlp`.
#
# Hint: keep x and the activation for backward; add the whole bias b2 once, after the all-reduce.

# %%
# Check yourself (`python -m minidist exercises questions --lesson 09`): the answers, asserted.
fit = [memory_words_per_device([16384] * 9, 64, D, 4 // D, 2)["total"] * 4 / 1e9 for D in (4, 1)]
check_yourself("09", megatron_or_data=(megatron_words([1024] * 3, 256, 4) // 4,
                                       data_parallel_words(2 * 1024**2, 4) // 4),
               crossover_width=next(d for d in (2**k for k in range(4, 16))
                                    if megatron_words([d] * 5, 512, 4) < data_parallel_words(4 * d * d, 4)),
               which_fits=("tensor" if fit[1] < Device().memory / 1e9 < fit[0] else "data", *fit))
