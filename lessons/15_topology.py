# %% [markdown]
# # 15 — Topology and performance models: two-level clusters, hierarchical allreduce, the roofline
#
# **Goal.** Which allreduce is best "will depend on the network topology" (Hot Chips tutorial "Scaling
# DL Training"), and "to get best performance, you need to map processes to the hierarchy" ("Scaling
# Deep Learning" slides). This lesson
#
# 1. builds a two-level cluster: nodes of 4 accelerators on fast links, a network 10× slower between;
# 2. times the flat ring against the hierarchical and the 2-D torus allreduce on the simulated clock,
#    against the closed forms, and finds the crossover with recursive doubling;
# 3. places a data × pipeline × tensor grid, and a data × spatial grid, well and badly;
# 4. draws the roofline (Williams, Waterman, Patterson): per layer, and for distributed training;
# 5. runs the collectives NCCL uses; 6. prices real machines (DGX-1, PCIe-only node, fat tree) link by link.
#
# All times are simulated (the clock of `minidist.cluster`), except one measurement of NumPy's matmul.

# %%
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.cluster import LinkModel, Topology, run, run_traced
from minidist.collectives import allreduce
from minidist.collectives.topology_cost import flat_time, hierarchical_cost, hierarchical_speedup, torus_cost
from minidist.hardware.roofline import Machine, communication_intensity, model_costs, step_bound
from minidist.nn import (
    GPT,
    BatchNorm2d,
    Conv2d,
    CrossEntropyLoss,
    Flatten,
    Linear,
    MaxPool2d,
    ReLU,
    Sequential,
)
from minidist.optim import SGD
from minidist.parallel import Mesh, MeshShape, parallelize
from minidist.parallel.grids import GridSpatial
from minidist.sim.plots import save_figure

# %% [markdown]
# ## 1. A two-level cluster
#
# Rank r lives on node r // G. A message inside a node costs α_i + nβ_i, between nodes α_e + nβ_e.

# %%
INTRA = LinkModel(alpha=2e-6, beta=1 / 100e9)        # NVLink-like, 100 GB/s
INTER = LinkModel(alpha=2e-6, beta=1 / 10e9)         # the network: 10x lower bandwidth
TOPO = Topology(nodes=2, per_node=4, intra=INTRA, inter=INTER)


def ping(comm):
    if comm.rank == 0:
        comm.send(np.zeros(2**17), 1)      # 1 MiB to a neighbour in the node
        comm.send(np.zeros(2**17), 4)      # 1 MiB to the other node
    elif comm.rank in (1, 4):
        comm.recv(0)
    return comm.clock


clocks, trace = run_traced(ping, 8, link=TOPO)
for s in trace.rank_spans(0):
    print(f"{s.label:32s} {1e6 * (s.end - s.start):8.2f} us")
assert [s.level for s in trace.rank_spans(0)] == ["intra", "inter"]
assert clocks[4] - clocks[1] == INTER.time(2**20)

# %% [markdown]
# ## 2. Flat ring vs hierarchical vs 2-D torus
#
# The flat ring crosses the slow network at each of its 2(P − 1) steps: T = 2(P − 1)(α_e + n/P β_e).
# Hierarchical: reduce-scatter in the node, allreduce across nodes on n/G bytes, allgather in the node:
# T = 2(G − 1)(α_i + n/G β_i) + log2 N (α_e + n/G β_e). For large n the ratio tends to
# (2(P−1)/P β_e) / (2(G−1)/G β_i + β_e/G) = 1.75 / 0.4 ≈ 4.4 here.

# %%
SIZES = [2**k for k in range(6, 22, 3)]              # float64 elements: 512 B .. 16 MiB
ALGOS = ("ring", "recursive_doubling", "hierarchical", "torus")


def sweep(comm, sizes):
    out = {}
    for n in sizes:
        x = np.full(n, float(comm.rank))
        for algorithm in ALGOS:
            comm.barrier()
            t = comm.clock
            y = allreduce(comm, x, algorithm=algorithm)
            assert y[0] == sum(range(comm.world_size))
            out[algorithm, n] = comm.clock - t
    return out


measured = run(sweep, 8, SIZES, link=TOPO, timeout=120)
worst = {k: max(m[k] for m in measured) for k in measured[0]}
print(f"{'bytes':>10s}" + "".join(f"{a:>20s}" for a in ALGOS))
for n in SIZES:
    print(f"{8 * n:10d}" + "".join(f"{1e6 * worst[a, n]:18.1f}us" for a in ALGOS))
    assert np.isclose(worst["ring", n], flat_time("ring", TOPO, 8, 8 * n), rtol=1e-12)
    assert np.isclose(worst["hierarchical", n], hierarchical_cost(TOPO, 8 * n).time, rtol=1e-12)
    assert np.isclose(worst["torus", n], torus_cost(TOPO, 8 * n).time, rtol=1e-12)
    assert worst["hierarchical", n] < worst["ring", n]
big = SIZES[-1]
factor = worst["ring", big] / worst["hierarchical", big]
print(f"hierarchical beats the flat ring by {factor:.2f}x at {8 * big >> 20} MiB "
      f"(predicted {hierarchical_speedup(TOPO, 8 * big):.2f}x, limit 4.375x)")
assert np.isclose(factor, hierarchical_speedup(TOPO, 8 * big), rtol=1e-9) and factor > 4.0

# Crossover with flat recursive doubling (3 messages of n bytes, only one across nodes): small arrays
# favour it, large ones the hierarchical algorithm. Where do the closed forms cross?
grid = np.logspace(2, 8, 600)
rd = np.array([flat_time("recursive_doubling", TOPO, 8, b) for b in grid])
hier = np.array([hierarchical_cost(TOPO, b).time for b in grid])
crossover = grid[np.argmax(hier < rd)]
print(f"crossover with recursive doubling: about {crossover / 1024:.1f} KiB")
assert worst["recursive_doubling", SIZES[0]] < worst["hierarchical", SIZES[0]]
assert worst["recursive_doubling", big] > worst["hierarchical", big]

# Node count: 8 ranks as 2x4, 4x2 or 8x1 (the same 16 MiB); the last is all network.
shapes = [(2, 4), (4, 2), (8, 1)]
by_nodes = [hierarchical_cost(Topology(n, g, INTRA, INTER), 8 * big).time for n, g in shapes]
flat_by_nodes = [flat_time("ring", Topology(n, g, INTRA, INTER), 8, 8 * big) for n, g in shapes]
for (n, g), h, f in zip(shapes, by_nodes, flat_by_nodes):
    print(f"{n} nodes x {g}: hierarchical {1e3 * h:6.3f} ms, flat ring {1e3 * f:6.3f} ms")
assert by_nodes[0] < by_nodes[1] < by_nodes[2]

fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for a in ALGOS:
    axes[0].loglog([8 * n for n in SIZES], [worst[a, n] for n in SIZES], "o-", label=a)
axes[0].axvline(crossover, color="gray", ls=":", label="crossover (formula)")
axes[0].set(xlabel="bytes", ylabel="simulated time (s)", title="allreduce on 2 nodes x 4, network 10x slower")
axes[0].legend(fontsize="small")
labels = [f"{n}x{g}" for n, g in shapes]
axes[1].bar(np.arange(3) - 0.2, flat_by_nodes, 0.4, label="flat ring")
axes[1].bar(np.arange(3) + 0.2, by_nodes, 0.4, label="hierarchical")
axes[1].set(xticks=range(3), xticklabels=labels, xlabel="nodes x ranks per node", ylabel="time (s)",
            title="16 MiB over 8 ranks")
axes[1].legend(fontsize="small")
fig.tight_layout()
save_figure(fig, "15_hierarchical_allreduce.png")
plt.close(fig)

# %% [markdown]
# ## 3. Placing a data × pipeline × tensor grid
#
# Tensor parallelism allreduces activations (N·T tokens × d) twice per block forward and twice backward,
# data parallelism the gradients (≈ 12·d² per block) once per step: with N·T = 256 × 16 tokens ≫ d = 32 the
# tensor groups move the most bytes and belong inside a node. `Mesh(comm, data=2, pipeline=2, tensor=2)`
# numbers its ranks tensor-fastest, so a tensor group is two neighbours on one node. A placement is the
# communicator the mesh is built on: `comm.split(0, key)` renumbers the world, and the mesh over the
# renumbered ranks puts each tensor group across the two nodes (world rank r at mesh coordinates
# (d, p, t) with r = (t·P + p)·D + d: data fastest). `parallelize` trains the same tiny GPT on both —
# same training, same numbers, a different clock (which also charges each rank its share of the FLOPs,
# the same in both).

# %%
GPT_ARGS = {"vocab_size": 16, "block_size": 16, "n_layers": 2, "d_model": 32, "n_heads": 2}
ACROSS = MeshShape([("tensor", 2), ("pipeline", 2), ("data", 2)])    # data fastest: the bad placement
MESH_ORDER = MeshShape([("data", 2), ("pipeline", 2), ("tensor", 2)])  # Mesh's own rank order


def grid_step(comm, placement):
    placed = comm                # tensor_across: rank r takes the mesh rank of its coordinates in ACROSS
    if placement == "tensor_across":
        placed = comm.split(0, key=MESH_ORDER.rank(ACROSS.coords(comm.rank)))
    gpt = GPT(**GPT_ARGS, rng=np.random.default_rng(0), dtype=np.float64)
    trainer = parallelize(gpt, Mesh(placed, data=2, pipeline=2, tensor=2), loss_fn=CrossEntropyLoss(),
                          optimizer=lambda params: SGD(params, lr=0.01))
    tokens = np.random.default_rng(1).integers(0, 16, size=(2, 256, 16))
    comm.barrier()
    start = comm.clock
    loss = trainer.train_step(tokens[0], tokens[1])
    return comm.clock - start, loss


good = run(grid_step, 8, "tensor_inside", link=TOPO)
bad = run(grid_step, 8, "tensor_across", link=TOPO)
t_good, t_bad = max(t for t, _ in good), max(t for t, _ in bad)
print(f"one 2x2x2 step: tensor groups inside nodes {1e6 * t_good:.1f} us, across nodes {1e6 * t_bad:.1f} us")
assert [l for _, l in good] == [l for _, l in bad]          # same training, another clock
assert t_bad > 1.5 * t_good

# %% [markdown]
# **Data × spatial.** A spatial group exchanges halo rows at every convolution, forward and backward
# (bytes ∝ batch × channels × image width), sums the small convolution gradients and allgathers the last,
# pooled feature map; the data group allreduces the gradients once per step (bytes ∝ parameters). With
# 64 × 64 images, 8 channels and a small head the spatial group moves more bytes: keep it inside a node.
# `GridSpatial(comm, D, (Ph, Pw))` (minidist/parallel/grids/: spatial is not a `parallelize` axis)
# numbers ranks spatial-fastest; `placement="spatial_across"` puts each spatial pair on two nodes (and
# each data group inside one).

# %%


def spatial_step(comm, placement):
    rng = np.random.default_rng(0)
    convs = [Conv2d(c, 8, 3, padding=1, rng=rng, dtype=np.float64) for c in (4, 8, 8)]
    model = Sequential(convs[0], ReLU(), convs[1], ReLU(), convs[2], ReLU(), MaxPool2d(8),
                       Flatten(), Linear(8 * 8 * 8, 10, rng=rng, dtype=np.float64))
    grid = GridSpatial(comm, 4, (2, 1), placement=placement)
    net = grid.spatialize(model, (64, 64))
    x, y = rng.standard_normal((32, 4, 64, 64)), rng.integers(0, 10, 32)
    comm.barrier()
    start = comm.clock
    grid.train_step(net, CrossEntropyLoss(), SGD(model.parameters(), lr=0.01), x, y)
    sent = (grid.spatial_comm.stats.bytes_sent, grid.data_comm.stats.bytes_sent)
    return comm.clock - start, sent, model.parameters()[0].data


inside = run(spatial_step, 8, "spatial_inside", link=TOPO)
across = run(spatial_step, 8, "spatial_across", link=TOPO)
t_in, t_across = max(r[0] for r in inside), max(r[0] for r in across)
spatial_bytes, data_bytes = inside[0][1]
print(f"bytes sent per rank in one step: spatial group {spatial_bytes}, data group {data_bytes}")
print(f"one 4 x (2x1) step: spatial groups inside nodes {1e6 * t_in:.1f} us, "
      f"across nodes {1e6 * t_across:.1f} us (saves {100 * (1 - t_in / t_across):.0f}%)")
assert all(np.array_equal(a[2], b[2]) for a, b in zip(inside, across))   # same training, another clock
assert spatial_bytes > data_bytes and t_in < 0.85 * t_across

# %% [markdown]
# ## 4. The roofline
#
# Arithmetic intensity I = FLOPs / bytes moved; attainable FLOP/s = min(peak, bandwidth · I). Below the
# ridge (peak / bandwidth) a layer is memory-bound. First this machine: NumPy's matmul at a few sizes.

# %%
rates = []
for n in (64, 256, 1024):
    a = np.ones((n, n), np.float32)
    a @ a
    t0 = time.perf_counter()
    for _ in range(3):
        a @ a
    rates.append(2 * n**3 * 3 / (time.perf_counter() - t0))
print("NumPy float32 matmul on this machine (GFLOP/s):", [f"{r / 1e9:.1f}" for r in rates],
      f"fitted peak ~ {max(rates) / 1e9:.1f} GFLOP/s (loaded machine: indicative only)")

V100 = Machine()                                    # 15.7 TFLOP/s, 900 GB/s, 25 GB/s
cnn = Sequential(Conv2d(3, 64, 3, padding=1, rng=np.random.default_rng(0)), BatchNorm2d(64), ReLU(),
                 MaxPool2d(2), Flatten(), Linear(64 * 16 * 16, 1024, rng=np.random.default_rng(1)), ReLU(),
                 Linear(1024, 10, rng=np.random.default_rng(2)))
costs = model_costs(cnn, (256, 3, 32, 32))
for c in costs:
    print(f"{c.name:12s} forward I = {c.forward_intensity:8.2f} flop/B  "
          f"{V100.bound(c.forward_flops, c.forward_bytes)}-bound")
# the wide Linear computes; the first convolution (3 input channels only) still streams memory
assert V100.bound(costs[5].forward_flops, costs[5].forward_bytes) == "compute"
assert costs[0].forward_intensity < V100.ridge < costs[5].forward_intensity
assert all(V100.bound(c.forward_flops, c.forward_bytes) == "memory" for c in costs[1:5])
print("whole step:", step_bound(costs, V100)[0], "bound")

# Distributed roofline: FLOPs per byte sent per rank, MLP 4096-wide x 4 layers, batch 512, 8 ranks.
widths, batch = [4096] * 5, 512
intensity = {s: (lambda f, b: f / b)(*communication_intensity(widths, batch, s, 8))
             for s in ("data", "tensor", "pipeline")}
for s, i in intensity.items():
    print(f"{s:9s} communication intensity {i:9.1f} flop/B -> "
          f"{V100.attainable(i, V100.network_bw) / 1e12:6.2f} TFLOP/s attainable over one NVLink")
# data parallelism's intensity grows with the batch per rank (B/D): at 64 samples per rank it is lowest
assert intensity["pipeline"] > intensity["tensor"] > intensity["data"]

fig, axes = plt.subplots(1, 2, figsize=(11, 4))
xs = np.logspace(-2, 4, 200)
for ax, bw, what in ((axes[0], V100.memory_bw, "memory"), (axes[1], V100.network_bw, "network")):
    ax.loglog(xs, [V100.attainable(x, bw) for x in xs], "k-", label=f"roof ({what} {bw / 1e9:.0f} GB/s)")
    ax.set(xlabel=f"FLOPs per byte ({what})", ylabel="attainable FLOP/s")
points: dict[float, list[str]] = {}          # layers of equal intensity share one point and one label
for i, c in enumerate(costs):
    if c.forward_intensity > 0:              # Flatten does no FLOPs: nothing to place on a log axis
        points.setdefault(round(c.forward_intensity, 6), []).append(f"{i} {c.name}")
for (x, names), marker in zip(sorted(points.items()), "ovsDP^X*"):
    axes[0].loglog(x, V100.attainable(x), marker, ms=7, label=", ".join(names))
for s, i in intensity.items():
    axes[1].loglog(i, V100.attainable(i, V100.network_bw), "s", label=s)
axes[0].set_title("per layer (forward, batch 256, V100; Flatten: no FLOPs)")
axes[1].set_title("distributed: FLOPs per byte sent")
for ax in axes:
    ax.legend(fontsize="x-small")
fig.tight_layout()
save_figure(fig, "15_roofline.png")
plt.close(fig)

# %% [markdown]
# ## 6. Real machines: the DGX-1's cube-mesh, a PCIe-only node, a fat tree
#
# `minidist.cluster.machines` prices each pair of GPUs by its own link, at its source's bandwidth: NVLink 1
# 20 GB/s per link (the GP100 slide's "160GB/s NV Link": 4 links × 2 directions), PCIe 3.0 x16 15.75 GB/s.
# The DGX-1 joins two NVLink quads by links i — i + 4; its other 12 pairs go over PCIe. A ring in rank order
# crosses 3 → 4 and 7 → 0, both PCIe; the ring 0 1 2 3 7 6 5 4 stays on NVLink, and Rabenseifner's partners
# (r XOR 4, 2, 1) are all NVLink. A fat tree's hosts are 2, 4 or 6 Gigabit Ethernet links apart.

# %%
from minidist.cluster.machines import dgx1, fat_tree, pcie_node  # noqa: E402


def allreduce_ms(comm):
    x, out = np.ones(1 << 20, np.float32), {}
    for algorithm in ("ring", "rabenseifner"):
        comm.barrier()
        start = comm.clock
        allreduce(comm, x, algorithm=algorithm)
        out[algorithm] = (comm.clock - start) * 1e3
    return out


machines = {"DGX-1, GPU order": dgx1(), "DGX-1, NVLink ring": dgx1(order=[0, 1, 2, 3, 7, 6, 5, 4]),
            "PCIe-only node": pcie_node(), "4-ary fat tree": fat_tree(4)}
runs = {name: run(allreduce_ms, topo.size, link=topo) for name, topo in machines.items()}
times = {(name, a): max(r[a] for r in runs[name]) for name in machines for a in ("ring", "rabenseifner")}
for (name, algorithm), ms in times.items():
    print(f"{name:>26}  {algorithm:>12}: {ms:7.3f} ms")
dgx, nv, pcie = "DGX-1, GPU order", "DGX-1, NVLink ring", "PCIe-only node"
assert abs(times[dgx, "ring"] / times[pcie, "ring"] - 1) < 0.01          # two PCIe hops set the ring's pace
assert times[nv, "ring"] < 0.85 * times[dgx, "ring"]                     # placed on NVLink: 20 / 15.75 faster
assert times[dgx, "rabenseifner"] < times[dgx, "ring"]                   # XOR 4, 2, 1: every partner a link

# %% [markdown]
# **What to remember.** Map the communication to the hierarchy: on a cluster whose network is 10× slower
# than its nodes, reduce inside the node first (4.4× here for large arrays); small arrays still prefer few
# messages. Keep the group that moves the most bytes (tensor, or spatial with large images) inside a node.
# The roofline says whether a layer waits for arithmetic, memory or the network: big matmuls compute, norms
# and activations stream memory.

# %% [markdown]
# ## 5. The collectives NCCL uses: two binary trees, Van de Geijn's broadcast, permute, the bucket algorithm
#
# The tutorial's table of algorithms (after Pjesivac-Grbovic) lists, for large messages, the "Double
# Binary Tree" and "Van de Geijn Algorithm" for broadcast and reduce, and "Permute" among the collectives.
# NCCL's tree allreduce is the double binary tree (Sanders, Speck and Träff 2009): half the array on each
# of two binary trees, every rank interior in at most one of them, so no rank forwards more than one half
# downwards. Van de Geijn's broadcast scatters the array and allgathers it around the ring; that
# allgather, and the reduce-scatter before it in ring.py, is what Chan et al. 2007 ("Collective
# communication: theory, practice, and experience") call the *bucket algorithm*. Here it carries B's row
# blocks around the ring in a distributed GEMM: C = A B with A's row blocks fixed, P steps.

# %%
from minidist.collectives import broadcast, permute, ring_gemm, van_de_geijn_broadcast  # noqa: E402
from minidist.collectives.double_tree import binary_tree  # noqa: E402

P8, BIG = 8, 1 << 20                      # 8 ranks; 1 Mi float32 = 4 MiB, well past α/β


def nccl_collectives(comm, n):
    x = np.arange(n, dtype=np.int64) * (comm.rank + 1)           # integers: every sum is exact
    out = {}
    for name, call in (("tree", lambda: allreduce(comm, x, algorithm="tree")),
                       ("double_tree", lambda: allreduce(comm, x, algorithm="double_tree")),
                       ("binomial broadcast", lambda: broadcast(comm, x.astype(np.float32))),
                       ("van de Geijn", lambda: van_de_geijn_broadcast(comm, x.astype(np.float32)))):
        comm.barrier()
        before = (comm.stats.bytes_sent, comm.clock)
        out[name] = (call(), comm.stats.bytes_sent - before[0], comm.clock - before[1])
    return out


for parent, children in (binary_tree(P8, 0), binary_tree(P8, 1)):
    print("tree: root", parent.index(None), " children", {r: c for r, c in enumerate(children) if c})
for n in (256, BIG):
    runs = run(nccl_collectives, P8, n)
    total = np.arange(n, dtype=np.int64) * sum(range(1, P8 + 1))
    for name in runs[0]:
        worst = max(r[name][1] for r in runs)
        print(f"n = {n:>7}  {name:>18}: most bytes sent by a rank {worst:>9}, "
              f"time {max(r[name][2] for r in runs) * 1e6:8.1f} us")
    assert all(np.array_equal(r[name][0], total) for r in runs for name in ("tree", "double_tree"))
    assert all(np.array_equal(r["van de Geijn"][0], np.arange(n, dtype=np.float32)) for r in runs)
    worst = {name: max(r[name][1] for r in runs) for name in runs[0]}
    assert worst["double_tree"] <= 4 * -(-n // 2) * 8 < worst["tree"] == 3 * n * 8   # ~2n against log2(P) n
    assert worst["van de Geijn"] == 2 * (P8 - 1) * n // P8 * 4 < worst["binomial broadcast"] == 3 * n * 4
    vdg, tree = (max(r[name][2] for r in runs) for name in ("van de Geijn", "binomial broadcast"))
    assert (vdg < tree) == (n == BIG)     # scatter + allgather wins for large arrays, the tree for small

# The lecture's permute: x0 x1 x2 x3 -> x1 x0 x3 x2.
swapped = run(lambda comm: permute(comm, np.array([comm.rank]), [1, 0, 3, 2]), 4)
assert [int(y[0]) for y in swapped] == [1, 0, 3, 2]
rng = np.random.default_rng(0)
A, B = rng.integers(-9, 9, (12, 10)), rng.integers(-9, 9, (10, 6))
blocks = run(lambda comm: ring_gemm(comm, np.array_split(A, 4)[comm.rank], np.array_split(B, 4)[comm.rank]),
             4)
assert np.array_equal(np.concatenate(blocks), A @ B)                # exact: the one-process product
print("permute [1, 0, 3, 2]:", [int(y[0]) for y in swapped], "  ring GEMM on 4 ranks equals A @ B")

# %% [markdown]
# The double tree halves the most any rank sends (≈ 2n against the binomial root's log2 P · n), but each
# half still goes whole from level to level, so on this clock it takes about the binomial tree's time for
# large arrays (and twice its latency for small ones, one tree after the other): NCCL
# gets its bandwidth by also cutting each half into small chunks and pipelining them down the trees
# (`chain_broadcast` shows pipelining). Van de Geijn's broadcast sends 2(P − 1)/P · n from the root
# instead of log2 P · n and wins once n β dwarfs the P α it pays in latency; for 256 elements the tree wins.

# %% [markdown]
# ## Exercises
#
# * `hierarchical_allreduce` — `minidist/collectives/hierarchical.py`: reduce-scatter inside the node,
#   recursive doubling across nodes, allgather inside the node.
#   Check: `python -m pytest --exercise hierarchical_allreduce`.
