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
from minidist.parallel.expert import ExpertParallelMoE
from minidist.parallel.expert.cost import (
    alltoall_bytes_sent,
    counts_bytes_sent,
    imbalance,
    uniform_alltoall_bytes,
)
from minidist.parallel.switch_layouts import (
    LayoutGroups,
    expert_holdings,
    parallelize,
    slide_layouts,
    train_step,
)
from minidist.plots import save_figure

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
# A two-layer SwitchTransformer with 4 experts per layer on 4 ranks (8 for expert + model + data). Rank r
# sits at (data i, expert j, model m); it trains token set i·E + j; it holds all of the dense weights,
# and the experts of its expert slot — whole, or a 1/M slice of their d_ff under model parallelism.
# Every layout trains exactly like one process (tests/parallel/test_parallel_expert_layouts.py).

# %%
V, T, B = 11, 8, 2


def layout_worker(comm, layout):
    groups = LayoutGroups(comm, layout)
    model = parallelize(groups, SwitchTransformer(V, T, 2, 8, 2, 4, 16, rng=np.random.default_rng(0)))
    rng = np.random.default_rng(1)
    tokens, targets = rng.integers(0, V, (2, layout.token_sets * B, T))
    rows = slice(groups.token_set * B, (groups.token_set + 1) * B)
    opt = SGD(model.parameters(), lr=0.1)
    loss = train_step(groups, model, CrossEntropyLoss(), opt, tokens[rows], targets[rows])
    return expert_holdings(model), groups.token_set, loss


layouts = slide_layouts(4)
runs = {layout.name: run(layout_worker, layout.world_size, layout) for layout in layouts}
for name, results in runs.items():
    print(f"{name:18s}", "  ".join(f"r{r}: experts {sorted(h)} tokens {t}"
                                   for r, (h, t, _) in enumerate(results)))

# %%
colors = plt.get_cmap("tab10").colors
fig, axes = plt.subplots(2, len(layouts), figsize=(14, 5.2), gridspec_kw={"height_ratios": [5, 4]})
for col, layout in enumerate(layouts):
    results, top, bottom = runs[layout.name], axes[0, col], axes[1, col]
    for r, (held, token_set, _) in enumerate(results):
        top.add_patch(plt.Rectangle((r + 0.1, 4.1), 0.8, 0.8, color="0.6"))  # dense weights: everywhere
        for j, (start, stop) in held.items():
            top.add_patch(plt.Rectangle((r + 0.1, j + 0.1 + 0.8 * start), 0.8, 0.8 * (stop - start),
                                        color=colors[j]))
        bottom.add_patch(plt.Rectangle((r + 0.1, token_set + 0.1), 0.8, 0.8, color=colors[4 + token_set]))
    for ax, n_rows, labels in ((top, 5, [f"expert {j}" for j in range(4)] + ["dense"]),
                               (bottom, 4, [f"tokens {s}" for s in range(4)])):
        ax.set(xlim=(0, layout.world_size), ylim=(0, n_rows), xticks=np.arange(layout.world_size) + 0.5,
               xticklabels=range(layout.world_size), yticks=np.arange(n_rows) + 0.5)
        ax.set_yticklabels(labels if col == 0 else [], fontsize="small")
        ax.tick_params(length=0)
    top.set_title(layout.name, fontsize="medium")
    bottom.set_xlabel("rank")
axes[0, 0].set_ylabel("weights held")
axes[1, 0].set_ylabel("tokens held")
fig.suptitle("How the weights (top) and the data (bottom) are split over ranks — from the runs")
fig.tight_layout()
save_figure(fig, "18_switch_layouts.png")
plt.close(fig)

# %%
assert [sorted(h) for h, _, _ in runs["expert"]] == [[0], [1], [2], [3]]
assert {t for _, t, _ in runs["model"]} == {0} and all(h[0] == (0.0, 0.25) for h, _, _ in runs["model"][:1])
assert len({round(loss, 12) for _, _, loss in runs["model"]}) == 1  # model-parallel ranks share their tokens

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
