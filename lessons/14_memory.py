# %% [markdown]
# # 14 — Where the memory goes: optimizer state, activations, ZeRO and fully sharded data parallelism
#
# **Goal.** Measure what one training step holds in memory — parameters, gradients, optimizer state,
# activations — compare every measurement with its formula, and then remove the redundancy of data
# parallelism: every replica holds *all* of it. ZeRO shards the optimizer state (stage 1), the gradients
# (stage 2) and the parameters (stage 3, FSDP) over the P ranks; we measure memory and bytes sent per
# rank against P and find the largest model that fits a per-rank budget.
#
# Sources: the "Scaling Up Training" slides ("Storing Parameters": 1B parameters at fp16 = 1.86 GB;
# 175B do not fit an 80 GB A100); the HOT CHIPS tutorial ("the internal state may occupy 2-6X as much
# memory as the model itself"; activations "a major fraction of the memory"); Rajbhandari et al., "ZeRO:
# Memory Optimizations Toward Training Trillion Parameter Models".
#
# The ledger (`minidist.sim.memory`) does not estimate anything: `held_bytes(model, optimizer, ...)` adds up
# the distinct memory of the arrays actually held (a view counts once, through its base). The parallel
# wrappers call it themselves when given `memory=MemoryLedger(rank)`: after forward, after each layer
# that completes a bucket (or a gathered layer), after backward and after step.

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.cluster import Device, run
from minidist.collectives.pieces import split_sizes
from minidist.nn import Checkpoint, CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD, Adagrad, Adam, AdamW, RMSprop
from minidist.parallel.data import DataParallel
from minidist.parallel.data.zero import ZeRO
from minidist.parallel.data.zero_mixed import ShardedMixedPrecision
from minidist.precision import FP16
from minidist.sim.memory import CATEGORIES, MODEL_STATES, MemoryLedger, held_bytes
from minidist.sim.plots import figures_dir, save_figure
from minidist_course.questions import check_yourself

FIGURES = figures_dir()
GiB = 2**30


def mlp(widths, seed=0, dtype=np.float32):
    """Linear layers of the given widths with ReLU in between."""
    rng, layers = np.random.default_rng(seed), []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers += [Linear(a, b, rng=rng, dtype=dtype)] + ([ReLU()] if i < len(widths) - 2 else [])
    return Sequential(*layers)


# %% [markdown]
# ## 1. Parameters: the slide's arithmetic
#
# A parameter in fp16 takes 2 bytes. 1B parameters = 2·10⁹ bytes = 1.86 GiB (the slide's "GB" is GiB).
# For 175B parameters the same rule gives 175 × 1.86 = 326 GiB; the slide prints 316.2 GB, which does not
# follow from its own 1.86 — either way more than the 80 GB of the largest A100, before a single
# gradient, optimizer state or activation is stored.

# %%
one_billion = 1e9 * 2 / GiB
gpt3 = 175e9 * 2 / GiB
print(f"1B @ fp16 = {one_billion:.2f} GiB;  175B @ fp16 = {gpt3:.1f} GiB  (> 80 GB: {gpt3 * GiB > 80e9})")
assert round(one_billion, 2) == 1.86 and round(gpt3) == 326 and gpt3 * GiB > 80e9

# %% [markdown]
# ## 2. Optimizer state: SGD 0×, momentum 1×, Adam 2× — and the "2–6×" claim
#
# We take one step with each optimizer on the same fp32 model and measure what `optimizer.state` holds,
# in multiples of the model's own bytes.

# %%
x = np.random.default_rng(1).normal(size=(64, 256)).astype(np.float32)
y = np.arange(64) % 10
optimizers = {"SGD": lambda ps: SGD(ps, lr=0.1), "SGD momentum": lambda ps: SGD(ps, lr=0.1, momentum=0.9),
              "Adagrad": lambda ps: Adagrad(ps), "RMSprop": lambda ps: RMSprop(ps),
              "Adam": lambda ps: Adam(ps), "AdamW": lambda ps: AdamW(ps),
              "Adam amsgrad": lambda ps: Adam(ps, amsgrad=True),
              "RMSprop centered+momentum": lambda ps: RMSprop(ps, centered=True, momentum=0.9)}
ratio = {}
for name, make in optimizers.items():
    model = mlp([256, 512, 512, 10])
    opt, loss_fn = make(model.parameters()), CrossEntropyLoss()
    loss_fn.forward(model(x), y)
    model.backward(loss_fn.backward())
    opt.step()
    held = held_bytes(model, opt)
    ratio[name] = held["optimizer"] / held["parameters"]
    print(f"{name:26s} optimizer state = {ratio[name]:.0f} x the model")
assert [ratio[n] for n in ("SGD", "SGD momentum", "Adam", "AdamW", "Adagrad")] == [0, 1, 2, 2, 1]
assert ratio["Adam amsgrad"] == 3 and ratio["RMSprop centered+momentum"] == 3

# %% [markdown]
# "2–6×": with 16-bit training the *model* is the fp16 copy (2 bytes per parameter), while the momenta —
# and the fp32 master weights of mixed precision (lesson 03) — stay in fp32. Measured per parameter:
# an fp32 momentum buffer is 2× the fp16 model; Adam's two fp32 moments 4×; with the fp32 masters 6×.

# %%
model16 = sum(p.data.astype(np.float16).nbytes for p in model.parameters())
masters = held_bytes(model)["parameters"]                          # the fp32 weights the optimizer updates
momentum_state = ratio["SGD momentum"] * masters
adam_state = ratio["Adam"] * masters
claim = [momentum_state / model16, adam_state / model16, (adam_state + masters) / model16]
print("state / fp16 model: momentum {:.0f}x, Adam {:.0f}x, Adam + fp32 masters {:.0f}x".format(*claim))
assert claim == [2, 4, 6]

# %% [markdown]
# ## 3. Activations, and what checkpointing buys
#
# Forward keeps for backward each Linear's input and each ReLU's mask (lesson 01); the ledger finds them
# as the arrays the layers hold that are neither parameters nor buffers. `Checkpoint(segment)` (lesson 08)
# keeps only the segment's input and recomputes the rest in backward. Activations grow with the batch;
# parameters do not.

# %%
widths = [256] + [512] * 8 + [10]
batches = [32, 64, 128, 256, 512, 1024]
plain, ckpt, params = [], [], held_bytes(mlp(widths))["parameters"]
for b in batches:
    xb = np.random.default_rng(b).normal(size=(b, 256)).astype(np.float32)
    m = mlp(widths)
    m(xb)
    plain.append(held_bytes(m)["activations"])
    c = mlp(widths)
    layers = c.layers
    c = Sequential(Checkpoint(Sequential(*layers[:8])), Checkpoint(Sequential(*layers[8:16])), *layers[16:])
    c(xb)
    ckpt.append(held_bytes(c)["activations"])
for b, a, k in zip(batches, plain, ckpt):
    print(f"batch {b:4d}: activations {a / 2**20:6.2f} MiB, checkpointed {k / 2**20:5.2f} MiB")
# each of 8 hidden layers keeps a 512-wide fp32 input and a 1-byte mask per element, plus the 256-wide x
assert plain == [b * (256 * 4 + 8 * 512 * 4 + 8 * 512) for b in batches]
assert all(k < a / 4 for a, k in zip(plain, ckpt))
crossing = next(b for b, a in zip(batches, plain) if a > params)
print(f"parameters {params / 2**20:.2f} MiB: activations exceed them from batch {crossing} on")

fig, ax = plt.subplots(figsize=(6, 3.6))
ax.plot(batches, np.array(plain) / 2**20, "o-", label="activations")
ax.plot(batches, np.array(ckpt) / 2**20, "s-", label="activations, 2 checkpointed segments")
ax.axhline(params / 2**20, color="gray", ls="--", label="parameters")
ax.set(xlabel="batch size", ylabel="MiB held after forward", xscale="log", yscale="log",
       title="activation memory grows with the batch")
ax.legend()
save_figure(fig, "14_activations.png")

# %% [markdown]
# ## 4. DataParallel against ZeRO-1, -2, -3 on the cluster
#
# One step of each on P = 1…4 ranks, Adam (K = 2b), fp32 (b = 4). With Ψ_r = Σ over groups of
# split_sizes(n, P)[r] (the rank's pieces; Ψ/P when P divides every group) and Ψ_l the layer sizes:
#
#     DataParallel  (b + b + K)·Ψ          ZeRO-1  (b + b)·Ψ + K·Ψ_r
#     ZeRO-2        b·Ψ + (b + K)·Ψ_r      ZeRO-3  (b + b + K)·Ψ_r  (+ 2b·max Ψ_l while a layer runs backward)
#
# Bytes sent per rank and step (ring): a reduce-scatter of n elements sends b·(n − n_r), an allgather
# b·(n − n_{r+1}); data parallelism and ZeRO-1/2 do one of each per group, 2(P − 1)/P·bΨ when P divides n;
# ZeRO-3 gathers each layer twice (forward and backward): 3(P − 1)/P·bΨ, 1.5× as many.

# %%
WIDTHS = [64, 96, 96, 10]                      # layers of 6240, 9312 and 970 parameters
LAYERS = [a * b + b for a, b in zip(WIDTHS[:-1], WIDTHS[1:])]
PSI, B = sum(LAYERS), 4


def one_step_each(comm):
    """One step of DP, ZeRO stages 1-3 and (section 5) ZeRO with mixed precision; per strategy: held bytes
    after the step, bytes sent, the ledger the wrapper filled."""
    rng = np.random.default_rng(2)
    xb, yb = rng.normal(size=(32, WIDTHS[0])).astype(np.float32), rng.integers(0, 10, size=32)
    out = {}
    for name in ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "ZeRO-1 mixed", "ZeRO-2 mixed", "ZeRO-3 mixed"):
        ledger, model = MemoryLedger(comm.rank), mlp(WIDTHS)
        if name == "DP":
            wrapper = DataParallel(comm, model, Adam(model.parameters()), CrossEntropyLoss(),
                                   gradient_as_bucket_view=True, memory=ledger)
        else:
            mixed = {"mixed": ShardedMixedPrecision(FP16)} if "mixed" in name else {}
            wrapper = ZeRO(comm, model, lambda ps: Adam(ps), CrossEntropyLoss(),
                                         stage=int(name[5]), memory=ledger, **mixed)
        before = comm.stats.bytes_sent
        wrapper.train_step(xb, yb)
        out[name] = (ledger.timeline[-1][2], comm.stats.bytes_sent - before, ledger)   # after step
    return out


def formulas(p, r):
    """(model-state bytes, bytes sent) of rank r of P, per strategy."""
    nr = lambda n, i: split_sizes(n, p)[i % p]  # noqa: E731
    psi_r12, psi_r3 = nr(PSI, r), sum(nr(n, r) for n in LAYERS)    # one bucket / one group per layer
    rs = lambda groups: sum(B * (n - nr(n, r)) for n in groups)      # noqa: E731
    ag = lambda groups: sum(B * (n - nr(n, r + 1)) for n in groups)  # noqa: E731  (the ring's allgather)
    mine = lambda groups: sum(B * (p - 1) * nr(n, r) for n in groups)  # noqa: E731  (my piece to P − 1)
    k = 2 * B
    return {"DP": ((2 * B + k) * PSI, rs([PSI]) + ag([PSI])),
            "ZeRO-1": (2 * B * PSI + k * psi_r12, rs([PSI]) + mine([PSI])),
            "ZeRO-2": (B * PSI + (B + k) * psi_r12, rs([PSI]) + mine([PSI])),
            "ZeRO-3": ((2 * B + k) * psi_r3, rs(LAYERS) + 2 * mine(LAYERS))}


STRATEGIES = ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
WORLD = [1, 2, 3, 4]
measured = {P: run(one_step_each, P) for P in WORLD}
for P in WORLD:
    for r, out in enumerate(measured[P]):
        for s in STRATEGIES:
            held, sent, _ = out[s]
            assert ((held["parameters"] + held["gradients"] + held["optimizer"], sent)
                    == formulas(P, r)[s]), (P, r, s)
    print(f"P = {P}: rank 0 holds " + ", ".join(
        f"{s} {sum(measured[P][0][s][0][c] for c in CATEGORIES[:3]) / 1024:.0f} KiB" for s in STRATEGIES))
assert measured[2][0]["DP"][1] == 2 * (2 - 1) / 2 * B * PSI            # P = 2 divides every layer here
assert measured[2][0]["ZeRO-3"][1] == 3 * (2 - 1) / 2 * B * PSI
print("every rank's measured memory and bytes sent equal the formulas, for P = 1..4")

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
for s, marker, size, dash in zip(STRATEGIES, "osd^", (11, 8, 5, 6), ("-", "--", ":", "-")):
    mem = [sum(measured[P][0][s][0][c] for c in CATEGORIES[:3]) / 1024 for P in WORLD]
    sent = [measured[P][0][s][1] / 1024 for P in WORLD]
    for ax, ys in ((left, mem), (right, sent)):   # open markers of decreasing size: equal curves stay visible
        ax.plot(WORLD, ys, marker, ls=dash, ms=size, mfc="none", mew=1.5, label=s)
left.set(xlabel="ranks P", ylabel="KiB per rank (params + grads + Adam state)", title="memory per rank",
         xticks=WORLD)
right.set(xlabel="ranks P", ylabel="KiB sent per rank per step", xticks=WORLD,
          title="communication per rank (DP = ZeRO-1 = ZeRO-2)")
left.legend()
right.legend()
save_figure(fig, "14_zero_memory.png")

# %% [markdown]
# The ledger's timeline of one ZeRO-3 step (rank 0 of P = 4): each layer's parameters exist in full only
# while it runs — twice, once in forward, once in backward, with its full gradient until the reduce-scatter.

# %%
ledger = measured[4][0]["ZeRO-3"][2]
labels = [label for _, label, _ in ledger.timeline]
stack = np.array([[held[c] / 1024 for c in CATEGORIES] for _, _, held in ledger.timeline]).T
fig, ax = plt.subplots(figsize=(8, 3.8))
ax.stackplot(np.arange(len(labels)), stack, labels=CATEGORIES, step="post")
ax.set_xticks(np.arange(len(labels)), labels, rotation=35, ha="right", fontsize=7)
ax.set(ylabel="KiB held (rank 0)", title="ZeRO-3, one step: gather, use, free")
ax.legend(fontsize=7, loc="upper left")
fig.tight_layout()
save_figure(fig, "14_zero3_timeline.png")
peak = ledger.peak(MODEL_STATES)
assert peak == (2 * B + 2 * B) * sum(split_sizes(n, 4)[0] for n in LAYERS) + 2 * B * max(LAYERS)
print(f"ZeRO-3 peak of the model states = (2b + K)·Ψ_r + 2b·max Ψ_l = {peak} bytes, as measured")

# %% [markdown]
# ## 5. The largest model that fits
#
# With the ZeRO paper's mixed-precision Adam — fp16 parameters and gradients (2 + 2 bytes) and K = 12
# bytes of fp32 state (master weights, momentum, variance) — the model states take 16Ψ bytes per rank
# under data parallelism: ZeRO-1 4Ψ + 12Ψ/P, ZeRO-2 2Ψ + 14Ψ/P, ZeRO-3 16Ψ/P.
#
# minidist runs that recipe (`mixed=ShardedMixedPrecision(FP16)`: the recipe of lesson 03 with the fp32
# master weights and Adam's moments kept only for the rank's shard). FP16 is *emulated*: the values are
# FP16 numbers stored in float32 arrays, so the ledger counts 4 bytes for each, not 2; it counts the fp32
# master shard as optimizer state, like the paper's K. Measured after one step of section 4's run:
#
#     ZeRO-1  4Ψ + 4Ψ + 12Ψ_r     ZeRO-2  4Ψ + 16Ψ_r     ZeRO-3  20Ψ_r
# — the paper's formulas with 4 in place of 2; halving the emulated parameters and gradients gives them.

# %%
for P in WORLD:
    for r, out in enumerate(measured[P]):
        psi_r12, psi_r3 = split_sizes(PSI, P)[r], sum(split_sizes(n, P)[r] for n in LAYERS)
        expected = {1: (4 * PSI, 4 * PSI, 12 * psi_r12), 2: (4 * PSI, 4 * psi_r12, 12 * psi_r12),
                    3: (4 * psi_r3, 4 * psi_r3, 12 * psi_r3)}
        for stage in (1, 2, 3):
            assert (tuple(out[f"ZeRO-{stage} mixed"][0][c] for c in MODEL_STATES)
                    == expected[stage]), (P, r, stage)
real = {s: (lambda h: h["parameters"] / 2 + h["gradients"] / 2 + h["optimizer"])(
            measured[2][0][s + " mixed"][0])
        for s in ("ZeRO-1", "ZeRO-2", "ZeRO-3")}
print("P = 2, mixed precision with 2-byte storage: "
      + ", ".join(f"{s} {v / PSI:.0f}Ψ" for s, v in real.items()))
assert real == {"ZeRO-1": 4 * PSI + 12 * PSI / 2, "ZeRO-2": 2 * PSI + 14 * PSI / 2, "ZeRO-3": 16 * PSI / 2}

# %% [markdown]
# On a 16 GiB V100 (`minidist.cluster.Device`'s memory), ignoring activations. The bytes per parameter
# come from the library's accounting measured above (rank 0, 2-byte storage), fitted as a + b/P on P = 1, 2
# and checked on P = 3, 4 (uneven shards: within 2%); they are the paper's formulas.

# %%
def measured_per_parameter(stage: str, P: int) -> float:
    held = measured[P][0][stage + " mixed"][0]
    return (held["parameters"] / 2 + held["gradients"] / 2 + held["optimizer"]) / PSI


per_param = {}
for stage, paper in (("ZeRO-1", (4, 12)), ("ZeRO-2", (2, 14)), ("ZeRO-3", (0, 16))):
    f1, f2 = measured_per_parameter(stage, 1), measured_per_parameter(stage, 2)
    a, b = 2 * f2 - f1, 2 * (f1 - f2)                  # a + b = f(1), a + b/2 = f(2)
    assert (a, b) == paper and all(abs(measured_per_parameter(stage, P) / (a + b / P) - 1) < 0.02
                                   for P in (3, 4)), stage
    per_param[stage] = lambda P, a=a, b=b: a + b / P
per_param = {"DP": lambda P: per_param["ZeRO-1"](1), **per_param}    # one rank holds everything: 16 bytes
budget = Device().memory
for P in (1, 8, 64, 1024):
    print(f"P = {P:4d}: " + ", ".join(f"{s} {budget / f(P) / 1e9:7.1f}B" for s, f in per_param.items()))
assert per_param["DP"](1) * 1.5e9 > budget           # the paper's 1.5B GPT-2 does not fit data-parallel
assert per_param["ZeRO-3"](1024) * 175e9 < budget    # 175B fits with ZeRO-3 over 1024 ranks
assert budget / per_param["ZeRO-1"](1024) < 4.3e9 and budget / per_param["ZeRO-2"](1024) < 8.6e9

# %% [markdown]
# ZeRO-1 and -2 stop at 4Ψ and 2Ψ bytes however many ranks share the state: the replicated fp16
# parameters (and gradients) remain. Only ZeRO-3 keeps shrinking with P — at the price of 1.5× the bytes.
#
# The planner (`python -m minidist plan`, `minidist/plan/memory.py`) prices the same states for a real
# job, and what the states leave out: a GPU's allocator peaks at the step's largest *moment*, the last
# micro-batch's loss, when every activation is held beside the logits at the vocabulary's size. For a 7B
# GPT (32 layers, d = 4096, T = 4096) on 64 H100s, data parallel: FlashAttention keeps its output and
# log-sum-exp per layer, eager attention Korthikanti's 5·a·T² bytes of scores besides. Its bytes sent per
# step are the paper's (and this section's measured) 2Ψ for ZeRO-1 and -2, 3Ψ for ZeRO-3.

# %%
from minidist.plan import Layout as PlanLayout  # noqa: E402
from minidist.plan import ModelSpec, predict_memory  # noqa: E402
from minidist.plan.memory import peak_breakdown  # noqa: E402
from minidist.plan.predict import data_bytes  # noqa: E402

gpt7b = ModelSpec(layers=32, d_model=4096, heads=32, seq=4096, batch=512)
for stage in (0, 1, 2, 3):
    lay = PlanLayout(dp=64, zero=stage)
    flash, eager = predict_memory(gpt7b, lay), predict_memory(gpt7b, lay, attention="eager")
    (moment, total), *parts = peak_breakdown(flash, micro_batches=lay.micro_batches(gpt7b))
    held = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in parts if v)
    print(f"ZeRO-{stage}: peak {total / 1e9:5.1f} GB at the {moment} ({held}); eager attention "
          f"{eager['total'] / 1e9:5.1f} GB; sent {data_bytes(gpt7b, lay) / 1e9:5.1f} GB a step")
    assert eager["total"] - flash["total"] > 32 * 5 * 32 * 4096 ** 2 * 0.99   # the scores of 32 layers
sent = {stage: data_bytes(gpt7b, PlanLayout(dp=64, zero=stage)) for stage in (1, 2, 3)}
assert sent[1] == sent[2] and sent[3] == 1.5 * sent[1]
assert sent[3] / sent[1] == measured[2][0]["ZeRO-3"][1] / measured[2][0]["ZeRO-1"][1]   # as the cluster sent
assert predict_memory(gpt7b, PlanLayout(dp=64, zero=3))["total"] < 80e9                  # fits an H100
#
# ## Exercises
#
# * `zero1_shard_update` — `minidist.parallel.data.flat.zero1_shard_update(comm, groups, optimizer)`:
#   reduce-scatter each group's gradient into its shard, step the optimizer on the shards, allgather the
#   updated shards into every rank's full parameters. Check: `python -m pytest --exercise zero1_shard_update`
#   (before the exercise map is regenerated:
#   `python -m pytest tests/parallel/test_parallel_zero_exercise.py`).

# %%
# Check yourself (`python -m minidist exercises questions --lesson 14`): the answers, asserted.
lowest = next(s for s, f in per_param.items() if f(64) * 7.5e9 <= 40e9)
check_yourself("14", zero2_bytes=per_param["ZeRO-2"](64), lowest_stage=(lowest, per_param[lowest](64) * 7.5),
               zero3_ranks=next(2**k for k in range(12) if per_param["ZeRO-3"](2**k) * 175e9 <= 80e9))
