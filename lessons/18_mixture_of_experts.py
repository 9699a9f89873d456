# %% [markdown]
# # 18 — Mixture of experts and expert parallelism: the Switch Transformer slide
#
# **Goal.** The "Scaling Up Training" slides end their tour of parallelism with the Switch Transformer
# figure (Fedus et al., "Switch Transformers: Scaling to Trillion Parameter Models with Simple and
# Efficient Sparsity"): how the *model weights* and how the *data* are split over cores under data,
# model, expert, expert + data and expert + model + data parallelism. This lesson
#
# 1. builds the mixture-of-experts layer: a router sends each token to k of E expert MLPs, so the
#    parameters grow with E while the FLOPs per token stay those of k experts;
# 2. balances the experts with the Switch auxiliary loss N · Σ_i f_i · P_i, and drops what overflows the
#    expert capacity C = k · capacity_factor · tokens / experts;
# 3. spreads the experts over ranks: tokens travel to their expert by all-to-all and back by a second;
# 4. runs the slide's five layouts on the cluster and draws, from those runs, what each rank holds.

# %%
import itertools

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.cluster import run
from minidist.nn import GELU, CrossEntropyLoss, Linear, MoE, MSELoss, Sequential, SwitchTransformer
from minidist.optim import SGD, Adam
from minidist.parallel import Mesh, parallelize
from minidist.parallel.expert import ExpertParallelMoE
from minidist.parallel.expert.cost import (
    alltoall_bytes_sent,
    counts_bytes_sent,
    imbalance,
    uniform_alltoall_bytes,
)
from minidist.sim.plots import save_figure

# %% [markdown]
# ## 1. More parameters at constant compute
#
# Router: p = softmax(x · W_rᵀ). Switch (top-1) sends token x to e = argmax p and scales that expert's
# output by the gate p_e, so the router learns through the gate; GShard (top-2) uses the two best, gates
# renormalised. An expert is the transformer's MLP, Linear(d, d_ff) → GELU → Linear(d_ff, d):
#
#     parameters ≈ d·E + E·(2·d·d_ff + d_ff + d)        forward FLOPs per token ≈ 2·d·E + k · 4·d·d_ff

# %%
D, D_FF = 64, 256
rows = []
for num_experts in (1, 2, 4, 8, 16, 32):
    moe = MoE(D, D_FF, num_experts, k=1, rng=np.random.default_rng(0))
    rows.append((num_experts, moe.num_parameters(), moe.flops_per_token()))
    print(f"E = {num_experts:2d}: {moe.num_parameters():8d} parameters, "
          f"{moe.flops_per_token():7d} FLOPs/token")
dense = Sequential(Linear(D, D_FF, rng=np.random.default_rng(0)), GELU(),
                   Linear(D_FF, D, rng=np.random.default_rng(0)))
assert rows[-1][1] > 31 * dense.num_parameters()              # 32 experts: 32× the MLP's weights ...
assert rows[-1][2] < 1.1 * 4 * D * D_FF                         # ... at 1.06× its FLOPs (the router)

# %% [markdown]
# ## 2. Load balance and capacity
#
# Left alone, a router tends to favour a few experts (here the inputs have a non-zero mean, which tilts
# it from the start). The Switch auxiliary loss, added with weight α = 0.01–0.1,
#
#     aux = N · Σ_i f_i · P_i,   f_i = fraction of tokens sent to i,   P_i = mean router probability of i,
#
# with N the number of experts, is smallest (= 1) when both are uniform; f counts tokens and has no
# gradient, so the router learns balance through P. Imbalance below is
# max load / mean load (1 is perfect, E means one expert gets everything).

# %%
def train_balance(aux_coef: float, steps: int = 150) -> list[float]:
    rng = np.random.default_rng(0)
    moe = MoE(8, 16, 8, k=1, capacity_factor=2.0, aux_loss_coef=aux_coef, rng=np.random.default_rng(1),
              dtype=np.float64)
    teacher = Sequential(Linear(8, 32, rng=np.random.default_rng(2), dtype=np.float64), GELU(),
                         Linear(32, 8, rng=np.random.default_rng(3), dtype=np.float64))
    opt, loss_fn, history = Adam(moe.parameters(), lr=1e-2), MSELoss(), []
    for _ in range(steps):
        x = rng.standard_normal((128, 8)) + 1.0
        opt.zero_grad()
        loss_fn.forward(moe.forward(x), teacher.forward(x))
        moe.backward(loss_fn.backward())
        opt.step()
        history.append(imbalance(np.bincount(moe.routing.experts[:, 0], minlength=8)))
    return history


free, balanced = train_balance(0.0), train_balance(0.1)
late_free, late_balanced = np.mean(free[-20:]), np.mean(balanced[-20:])
print(f"imbalance over the last 20 steps: {late_free:.2f} without the auxiliary loss, "
      f"{late_balanced:.2f} with it")
assert late_balanced < balanced[0] and late_balanced < 0.5 * late_free

# %% [markdown]
# Each expert has room for C = ⌈k · capacity_factor · S / E⌉ assignments of a group of S tokens (k·S
# assignments share E experts: GShard's and DeepSpeed's top2gating set it so); what overflows is
# dropped — the layer outputs 0 for it and the block's residual carries it on unchanged. A larger
# capacity factor drops less but pads more (on real hardware every expert's buffer is C rows). Without
# the k, top-2 would drop at least 1 − cf/2 of its assignments however well balanced (37.5% at 1.25).
# GShard also dispatches the second choice only with probability 2·g₂ ("random routing"), which frees
# slots where the second expert barely matters.

# %%
factors = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0]
x = np.random.default_rng(5).standard_normal((512, 8)) + 1.0
dropped = {}                                   # (k, capacity rule) -> assignments dropped, per factor
for k, rule in ((1, "k·cf·S/E"), (2, "k·cf·S/E"), (2, "cf·S/E")):
    skewed = MoE(8, 16, 8, k=k, rng=np.random.default_rng(1), dtype=np.float64)
    for factor in factors:
        skewed.capacity_factor = factor if rule == "k·cf·S/E" else factor / k   # the top-1 formula's C
        skewed.forward(x)
        dropped[k, rule, factor] = skewed.routing.dropped_assignments / (k * len(x))
    print(f"top-{k}, C = ⌈{rule}⌉: " + ", ".join(f"{f}: {100 * dropped[k, rule, f]:.1f}%" for f in factors))
assert all(dropped[1, "k·cf·S/E", a] >= dropped[1, "k·cf·S/E", b] for a, b in itertools.pairwise(factors))
assert dropped[1, "k·cf·S/E", 0.5] >= 0.5
# the top-1 formula drops at least 1 − cf/2 of top-2's assignments; the k·cf·S/E capacity far fewer
assert all(dropped[2, "cf·S/E", f] >= max(1 - f / 2, 0) - 1e-12 > dropped[2, "k·cf·S/E", f]
           for f in factors[:5])
gshard = MoE(8, 16, 8, k=2, capacity_factor=1.0, second_expert="random", rng=np.random.default_rng(1),
             dtype=np.float64)
gshard.forward(x)
r = gshard.routing
sent = (~r.skipped[:, 1]).mean()
print(f"GShard's random routing, cf = 1: {sent:.0%} of second choices dispatched (E[2·g₂] = "
      f"{np.mean(2 * r.gates[:, 1]):.0%}), {100 * r.dropped_assignments / (2 * len(x)):.1f}% dropped against "
      f"{100 * dropped[2, 'k·cf·S/E', 1.0]:.1f}% when every second choice goes")
assert r.dropped_assignments / (2 * len(x)) < dropped[2, "k·cf·S/E", 1.0]
assert abs(sent - np.mean(2 * r.gates[:, 1])) < 0.05

# %% [markdown]
# ## 3. Expert parallelism: two all-to-alls
#
# E experts on e ranks, E/e each; every rank routes its own tokens, then per MoE layer
# dispatch (tokens → their expert's rank) and combine (outputs → back) forward, the same two backward.
# A rank sending n_out kept tokens off-rank and receiving n_in sends 2·(n_out + n_in)·d·bytes per step
# (plus the counts, E/e integers per peer). With even routing n_out ≈ n_in ≈ k·n·(e−1)/e: the bytes depend
# on the tokens, not on the size of the experts — unlike data parallelism's all-reduce.

# %%
TOKENS, WIDTH, EXPERTS = 64, 16, 8


def alltoall_worker(comm):
    moe = MoE(WIDTH, 32, EXPERTS, capacity_factor=2.0, rng=np.random.default_rng(0))
    layer = ExpertParallelMoE(comm, moe)
    x = np.random.default_rng(comm.rank).standard_normal((TOKENS, WIDTH)).astype(np.float32)
    before = comm.stats.bytes_sent
    layer.backward(np.ones_like(layer.forward(x)))
    return comm.stats.bytes_sent - before, layer.sent_tokens, layer.received_tokens


measured = {}
for e in (1, 2, 4, 8):
    results = run(alltoall_worker, e)
    for nbytes, n_out, n_in in results:
        assert nbytes == alltoall_bytes_sent(n_out, n_in, WIDTH, 4) + counts_bytes_sent(e, EXPERTS // e)
    measured[e] = np.mean([r[0] for r in results])
    print(f"e = {e}: {measured[e]:8.0f} bytes per rank measured, "
          f"{uniform_alltoall_bytes(TOKENS, 1, e, WIDTH, 4):8.0f} for perfectly even routing")
    assert abs(measured[e] - uniform_alltoall_bytes(TOKENS, 1, e, WIDTH, 4)) <= 0.1 * measured[e]  # near even

# %%
fig, axes = plt.subplots(1, 4, figsize=(15, 3.4))
experts_axis = [r[0] for r in rows]
axes[0].plot(experts_axis, [r[1] / rows[0][1] for r in rows], "o-", label="parameters")
axes[0].plot(experts_axis, [r[2] / rows[0][2] for r in rows], "s-", label="FLOPs per token")
axes[0].set(xscale="log", yscale="log", xlabel="experts E", ylabel="relative to E = 1",
            title="more parameters, same compute")
axes[0].set_xticks(experts_axis, [str(e) for e in experts_axis])
axes[1].plot(free, label="without auxiliary loss")
axes[1].plot(balanced, label="with α = 0.1")
axes[1].set(xlabel="step", ylabel="max load / mean load", title="load balance (8 experts)", ylim=(1, None))
for (k, rule), style in {(1, "k·cf·S/E"): "o-", (2, "k·cf·S/E"): "s-", (2, "cf·S/E"): "s--"}.items():
    axes[2].plot(factors, [100 * dropped[k, rule, f] for f in factors], style, label=f"top-{k}, C = ⌈{rule}⌉")
axes[2].set(xlabel="capacity factor cf", ylabel="assignments dropped (%)", title="capacity", ylim=(0, None))
ranks = sorted(measured)
axes[3].plot(ranks, [measured[e] for e in ranks], "o-", label="measured (mean per rank)")
axes[3].plot(ranks, [uniform_alltoall_bytes(TOKENS, 1, e, WIDTH, 4) for e in ranks], "k--",
             label="even routing")
axes[3].set(xlabel="expert-parallel ranks e", ylabel="bytes sent per rank", title="the all-to-alls, one step")
axes[3].set_xticks(ranks)
for ax in axes:
    ax.legend(fontsize="small")
fig.tight_layout()
save_figure(fig, "18_moe_scaling.png")
plt.close(fig)

# %% [markdown]
# ## 4. The slide's five layouts, run
#
# Each layout is a `Mesh` and `parallelize`: data is the data axis, expert the expert axis, and the slide's
# *model* parallelism the mesh's tensor axis, which splits every block Megatron-style — each expert's d_ff
# and, unlike the slide, the attention heads too.
#
#     data               Mesh(comm, data=4)                     every rank all weights, its own tokens
#     model              Mesh(comm, tensor=4)                   the same tokens, 1/4 of every expert's d_ff
#     expert             Mesh(comm, expert=4)                   its own experts and its own tokens
#     expert+data        Mesh(comm, data=2, expert=2)           expert groups of 2, replicated twice
#     expert+model+data  Mesh(comm, data=2, expert=2, tensor=2) each expert split over 2 ranks as well
#
# A two-layer SwitchTransformer with 4 experts per layer on 4 ranks (8 for expert + model + data). The rank
# at (data d, expert j) trains token set d·E + j of the S = D·E sets, and routes it as one group, so the one
# process it is checked against routes the batch in S groups (`groups=S`). What each rank holds is read
# from the runs: its share of the dense weights and, matched against `full_state_dict()`, which rows of
# which expert's first Linear; its tokens are the rows its first router saw, matched against one process's.

# %%
V, T, B = 11, 8, 2
LAYOUTS = {"data": dict(data=4), "model": dict(tensor=4), "expert": dict(expert=4),
           "expert+data": dict(data=2, expert=2), "expert+model+data": dict(data=2, expert=2, tensor=2)}


def token_sets(sizes):
    return sizes.get("data", 1) * sizes.get("expert", 1)


def switch_model(sets):
    return SwitchTransformer(V, T, 2, 8, 4, 4, 16, groups=sets, rng=np.random.default_rng(0),
                             dtype=np.float64)


def switch_batch(sets):
    return np.random.default_rng(1).integers(0, V, (2, sets * B, T))


def expert_rows(model, state):
    """{expert j: (start, stop) fraction of its d_ff this rank holds}, first MoE layer, by matching each
    held expert's first weight against the full, trained ones."""
    held = {}
    for ex in model.blocks[0].mlp.experts:
        w = ex.parameters()[0].data                                  # (rows held, d_model)
        for j in range(4):
            full = state[f"blocks.0.mlp.experts.{j}.layers.0.weight"]
            starts = [o for o in range(len(full) - len(w) + 1) if np.allclose(full[o:o + len(w)], w)]
            if starts:
                held[j] = (starts[0] / len(full), (starts[0] + len(w)) / len(full))
    return held


def record_router_inputs(model) -> list:
    """Make the first MoE layer's router append each input (its tokens' hidden states) to a list."""
    seen, router = [], model.blocks[0].mlp.router
    forward = router.forward
    router.forward = lambda x: seen.append(x.copy()) or forward(x)
    return seen


def layout_worker(comm, sizes):
    sets = token_sets(sizes)
    model = switch_model(sets)
    seen = record_router_inputs(model)
    trainer = parallelize(model, Mesh(comm, **sizes), loss_fn=CrossEntropyLoss(),
                          optimizer=lambda params: SGD(params, lr=0.1))
    loss = trainer.train_step(*switch_batch(sets))
    state = trainer.full_state_dict()
    experts = {id(p) for block in model.blocks for ex in block.mlp.experts for p in ex.parameters()}
    dense = sum(p.size for p in model.parameters() if id(p) not in experts)        # held here
    dense /= sum(v.size for name, v in state.items() if ".experts." not in name)   # of the whole model's
    return expert_rows(model, state), seen[0], loss, dense


runs, expected = {}, {}
for name, sizes in LAYOUTS.items():
    sets = token_sets(sizes)
    one = switch_model(sets)
    seen = record_router_inputs(one)
    x, y = switch_batch(sets)
    expected[name] = CrossEntropyLoss().forward(one.forward(x), y) + one.router_loss  # train_step's loss
    per_set = np.split(seen[0], sets)                  # one process's router input, token set by token set
    results = run(layout_worker, int(np.prod(list(sizes.values()))), sizes)
    runs[name] = [(held, next(s for s in range(sets) if np.allclose(rows, per_set[s])), loss, dense)
                  for held, rows, loss, dense in results]
    assert all(np.isclose(loss, expected[name], rtol=1e-10) for _, _, loss, _ in runs[name])
    print(f"{name:18s}", "  ".join(f"r{r}: experts {sorted(h)} tokens {t}"
                                   for r, (h, t, _, _) in enumerate(runs[name])))
# %%
colors = plt.get_cmap("tab10").colors
fig, axes = plt.subplots(2, len(LAYOUTS), figsize=(14, 5.2), gridspec_kw={"height_ratios": [5, 4]})
for col, (name, sizes) in enumerate(LAYOUTS.items()):
    results, top, bottom = runs[name], axes[0, col], axes[1, col]
    for r, (held, token_set, _, dense) in enumerate(results):
        top.add_patch(plt.Rectangle((r + 0.1, 4.1), 0.8, 0.8 * dense, color="0.6"))  # its share of the dense
        for j, (start, stop) in held.items():
            top.add_patch(plt.Rectangle((r + 0.1, j + 0.1 + 0.8 * start), 0.8, 0.8 * (stop - start),
                                        color=colors[j]))
        bottom.add_patch(plt.Rectangle((r + 0.1, token_set + 0.1), 0.8, 0.8, color=colors[4 + token_set]))
    world = len(results)
    for ax, n_rows, labels in ((top, 5, [f"expert {j}" for j in range(4)] + ["dense"]),
                               (bottom, 4, [f"tokens {s}" for s in range(4)])):
        ax.set(xlim=(0, world), ylim=(0, n_rows), xticks=np.arange(world) + 0.5, xticklabels=range(world),
               yticks=np.arange(n_rows) + 0.5)
        ax.set_yticklabels(labels if col == 0 else [], fontsize="small")
        ax.tick_params(length=0)
    top.set_title(name + "\n" + " × ".join(f"{a} {n}" for a, n in sizes.items()), fontsize="medium")
    bottom.set_xlabel("rank")
axes[0, 0].set_ylabel("weights held")
axes[1, 0].set_ylabel("tokens held")
fig.suptitle("How the weights (top) and the data (bottom) are split over ranks — from the runs")
fig.tight_layout()
save_figure(fig, "18_switch_layouts.png")
plt.close(fig)

# %%
assert [sorted(h) for h, _, _, _ in runs["expert"]] == [[0], [1], [2], [3]]
assert [t for _, t, _, _ in runs["expert+data"]] == [0, 1, 2, 3]                 # token set d·E + j
assert {t for _, t, _, _ in runs["model"]} == {0} and runs["model"][0][0][0] == (0.0, 0.25)
assert all(h == {j: (q / 4, (q + 1) / 4) for j in range(4)} for q, (h, *_) in enumerate(runs["model"]))
assert all(dense == 1.0 for name in ("data", "expert") for *_, dense in runs[name])
assert all(dense < 1.0 for *_, dense in runs["model"])        # the tensor axis splits attention as well

# %% [markdown]
# ## What to remember
#
# A mixture of experts buys parameters without FLOPs: each token visits k experts of E. The price is
# balance (an auxiliary loss keeps the router from crowding a few experts), capacity (what overflows is
# dropped, or the buffers are padded), and communication: two all-to-alls per layer forward and two
# backward, whose bytes follow the tokens. Expert parallelism composes with data parallelism (experts
# replicated over groups) and with model parallelism (each expert split Megatron-style) — the slide's
# five layouts, each checked against one process.
#
# ## Exercises
#
# * `moe_dispatch` — `minidist/nn/moe.py`: gather each expert's kept tokens in slot order (dispatch), and
#   add gate · expert output back into each token's row (combine).
#   Check: `python -m pytest --exercise moe_dispatch`.
