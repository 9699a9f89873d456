# %% [markdown]
# # 19 — Putting it together: newer pipeline schedules and a planner that predicts a layout's cost
#
# **Goal.** Lessons 8–18 taught each strategy alone. A user who knows them all asks the next question:
# for *my* model, *my* cluster and *my* memory, which combination, and what will it cost? This lesson
#
# 1. shrinks the pipeline bubble three ways, each a table of tasks checked against its paper's formula:
#    interleaved 1F1B (Narayanan et al. 2021), the zero-bubble schedule ZB-H1 (Qi et al. 2023) and the
#    bidirectional Chimera (Li and Hoefler 2021; the "Distributed Deep Learning (Part II)" slides);
# 2. runs the tables on the cluster: each trains like one process, and the simulated clock equals the
#    table replayed with each task's FLOPs;
# 3. composes data × pipeline × tensor on one grid of 8 ranks, training a tiny GPT;
# 4. asks the planner (`python -m minidist plan`) for a laptop-sized model and for 7B and 70B models on
#    64–1024 devices: per rank memory (ZeRO's 16 bytes per parameter, Korthikanti's activations) and step
#    time (roofline compute, the schedule's bubble, α-β communication per link level), beside what Llama 2,
#    NeMo and Megatron-LM published;
# 5. checks the planner, in a mode that prices what minidist does, against runs of every layout that fits
#    on ≤ 8 ranks (context parallelism and Chimera included).

# %%
from dataclasses import replace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.cluster import LinkModel, run, run_traced
from minidist.cluster.ledger import Device
from minidist.nn import GPT, CrossEntropyLoss, Linear, MSELoss, Sequential, SwitchTransformer, Tanh
from minidist.nn.runner import StepRunner
from minidist.optim import SGD, AdamW
from minidist.parallel import Mesh, Pipeline, parallelize
from minidist.parallel.pipeline.chimera import chimera_bubble, chimera_in_flight, chimera_schedule
from minidist.parallel.pipeline.interleaved import (
    interleaved_bubble,
    interleaved_in_flight,
    interleaved_schedule,
)
from minidist.parallel.pipeline.schedule import bubble_fraction, max_in_flight, one_f_one_b_schedule
from minidist.parallel.pipeline.tasks import format_tasks, replay
from minidist.parallel.pipeline.zero_bubble import zero_bubble_bubble, zero_bubble_schedule
from minidist.plan import Layout, ModelSpec, format_plan, hardware, plan, predict_memory
from minidist.plan.published import MEGATRON_MFU, RUNS
from minidist.sim.plots import figures_dir, plot_timeline, save_figure

# %% [markdown]
# ## 1. Four schedules as tables
#
# A task is (rank, kind, micro-batch, stage). With P ranks and M micro-batches:
#
# | schedule | what changes | bubble fraction | activations held (first rank) |
# |---|---|---|---|
# | 1F1B | one forward, one backward | (P − 1)/(M + P − 1) | P micro-batches |
# | interleaved | v chunks per rank, stage c·P + r | (P − 1)/(v·M + P − 1) | P + (P − 1)/v |
# | ZB-H1 | backward = B (dx) now + W (dW) later | (P − 1)/(3M + P − 1) | P (from F to B) |
# | Chimera | two pipelines, opposite directions | (P − 2)/(2M + P − 2) | between P/2 + 1 and P |
#
# (Ticks of one task each; ZB-H1's with F, B and W one tick each, M ≥ P.)

# %%
P, M, V = 4, 8, 2
tables = {"1F1B": one_f_one_b_schedule(P, M), f"interleaved (v = {V})": interleaved_schedule(P, M, V),
          "ZB-H1": zero_bubble_schedule(P, M), "Chimera": chimera_schedule(P, M)}
formulas = {"1F1B": (P - 1) / (M + P - 1), f"interleaved (v = {V})": interleaved_bubble(P, M, V),
            "ZB-H1": zero_bubble_bubble(P, M), "Chimera": chimera_bubble(P, M)}
for name, table in tables.items():
    print(f"{name:<18} {len(table):>3} ticks  bubble {bubble_fraction(table, P):.3f} "
          f"(formula {formulas[name]:.3f})  held per rank {max_in_flight(table, P)}")
    assert abs(bubble_fraction(table, P) - formulas[name]) < 1e-12
assert max_in_flight(tables[f"interleaved (v = {V})"], P) == interleaved_in_flight(P, M, V)
assert max_in_flight(chimera_schedule(P, P), P) == chimera_in_flight(P) == [3, 4, 4, 3]
print("\n" + format_tasks(chimera_schedule(P, P), P))

# %% [markdown]
# A tick is not a unit of time: an interleaved task is one chunk (1/v of a rank's layers), and a whole
# backward costs two forwards while ZB-H1's B and W cost one each. ``replay`` gives each task its time
# (here a full stage's forward = 1) and starts it as soon as its rank and its inputs are free: the
# timelines below, in the same units, show the bubble shrinking.

# %%
def duration(name):
    chunk = 1 / V if name.startswith("interleaved") else 1.0
    return lambda task: chunk * (1.0 if task.kind in "FW" or name == "ZB-H1" else 2.0)


colors = {"F": "tab:blue", "B": "tab:orange", "W": "tab:green"}
fig, axes = plt.subplots(len(tables), 1, figsize=(11, 7.5), sharex=True)
for ax, (name, table) in zip(axes, tables.items()):
    times = replay(table, duration(name))
    end, busy = max(e for _, e in times.values()), sum(e - s for s, e in times.values())
    for task, (start, stop) in times.items():
        ax.broken_barh([(start, stop - start)], (task.rank - 0.4, 0.8), facecolors=colors[task.kind],
                       edgecolors="white", linewidth=0.5)
    ax.set_yticks(range(P), [f"rank {r}" for r in range(P)]), ax.invert_yaxis()
    ax.set_title(f"{name}: step {end:.1f} forward-times, bubble {1 - busy / (P * end):.0%}", fontsize=10)
axes[-1].set_xlabel("time (one stage's forward on one micro-batch = 1)")
fig.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()],
           labels=["F", "B (whole backward; dx only in ZB-H1)", "W (dW, ZB-H1)"], loc="upper center", ncol=3)
fig.tight_layout(rect=(0, 0, 1, 0.95))
save_figure(fig, "19_schedules.png")
plt.close(fig)

# %% [markdown]
# With B twice as long as F, Chimera's bubble is larger than the tick formula's (which counts F and B
# as one tick each), yet smaller than 1F1B's; ZB-H1 pushes its W's to the end, where they fill the drain.
#
# ## 2. On the cluster: the same answer as one process, the time the table predicts
#
# `Pipeline` runs any table: rank r keeps the stages its tasks name, messages travel to the rank of
# the next (or previous) stage, ZB-H1's Linears split their backward (`DeferredWeightGrad`: B returns
# dx = dy·W and keeps (x, dy); W adds dyᵀ·x), and Chimera's two copies of a stage add their gradients
# before the step. A float64 MLP of 8 layers trained 3 SGD steps by each schedule must equal one process.

# %%
WIDTH, N, STEPS = 6, 8, 3


def build() -> Sequential:
    rng = np.random.default_rng(0)
    return Sequential(*[layer for _ in range(4) for layer in (Linear(WIDTH, WIDTH, rng=rng, dtype=np.float64),
                                                               Tanh())])


batch = np.random.default_rng(1).normal(size=(2, N, WIDTH))
reference = build()
one_process, opt = StepRunner(reference, MSELoss()), SGD(reference.parameters(), lr=0.1)
for _ in range(STEPS):          # the step runner: forward, loss, backward into the zeroed gradients
    reference.zero_grad()
    one_process.forward_backward(batch[0], batch[1])
    opt.step()
expected = [p.data for p in reference.parameters()]


def train(comm, table, stages, micro_batches):
    model = build()
    pipe = Pipeline(comm, model, loss_fn=MSELoss(), schedule=table, num_stages=stages,
                    num_micro_batches=micro_batches)
    optimizer = SGD(pipe.parameters(), lr=0.1)
    clocks = []
    for _ in range(STEPS):
        start = comm.clock
        pipe.train_step(batch[0], batch[1], optimizer)
        clocks.append(comm.clock - start)
    mine = {id(p) for p in pipe.parameters()}
    return {i: p.data for i, p in enumerate(model.parameters()) if id(p) in mine}, clocks


runs = {"1F1B": (one_f_one_b_schedule(4, 4), 4), "interleaved (v = 2)": (interleaved_schedule(2, 4, 2), 4),
        "ZB-H1": (zero_bubble_schedule(4, 4), 4), "Chimera": (chimera_schedule(4, 4), 4)}
for name, (table, stages) in runs.items():
    ranks = 1 + max(t.rank for tick in table for t in tick)
    results = run(train, ranks, table, stages, 4, link=LinkModel(0.0, 0.0))
    worst = max(float(np.max(np.abs(value - expected[i])))
                for params, _ in results for i, value in params.items())
    measured = max(clocks[-1] for _, clocks in results)
    # the replay: each task's FLOPs (a Linear 2·n·d², a Tanh n·d; B twice F, ZB's B and W one Linear each)
    n, per_stage = N // 4, 8 // stages // 2
    lin, tanh = 2 * n * WIDTH * WIDTH * per_stage, n * WIDTH * per_stage
    cost = {"F": lin + tanh, "B": lin + 2 * tanh if name == "ZB-H1" else 2 * (lin + tanh), "W": lin}
    predicted = max(e for _, e in replay(table, lambda t, cost=cost: cost[t.kind] / Device().flops).values())
    print(f"{name:<20} on {ranks} ranks: max |Δ parameter| {worst:.1e};  step {measured * 1e9:.3f} ns on the "
          f"clock, {predicted * 1e9:.3f} ns replayed")
    assert worst < 1e-12 and abs(measured - predicted) <= 1e-12 * predicted

# %% [markdown]
# ## 3. One grid: data × pipeline × tensor
#
# `Mesh(comm, data=2, pipeline=2, tensor=2)` places rank w = (d·P + p)·t + q on a grid with `comm.split`,
# and `parallelize` composes the strategies on it: a tensor group's t ranks run each block Megatron-style
# (heads and hidden units split, f/g all-reduces), a pipeline group's P ranks the task table, a data
# group's D ranks all-reduce their gradients. A tiny GPT on 2 × 2 × 2 = 8 ranks (1F1B, 2 micro-batches
# per replica) must again equal one process; `train_step` takes the whole batch on every rank and returns
# the global mean loss, the same bits on every rank. In the trace, ranks 0–3 are replica 0: stage 0 on
# ranks 0, 1 (a tensor pair), stage 1 on ranks 2, 3. The first step opens with the build (the split, and
# one all-reduce that tells every rank who holds which element, for `full_state_dict`); the data
# all-reduce and the loss's sum over the mesh close it. Stages are cut by unit count: stage 0 (embeddings,
# both blocks) works while stage 1 (LayerNorm, head) waits — balancing stages by cost is the next thing a
# planner fixes.

# %%
gpt_args = {"vocab_size": 11, "block_size": 8, "n_layers": 2, "d_model": 8, "n_heads": 2}
tokens = np.random.default_rng(2).integers(0, 11, size=(2, 8, 8))


def gpt_step(comm):
    gpt = GPT(**gpt_args, rng=np.random.default_rng(3), dtype=np.float64)
    trainer = parallelize(gpt, Mesh(comm, data=2, pipeline=2, tensor=2), loss_fn=CrossEntropyLoss(),
                          optimizer=lambda params: AdamW(params, lr=0.01), micro_batches=2, schedule="1f1b")
    return trainer.train_step(tokens[0], tokens[1])


expected_loss = CrossEntropyLoss().forward(
    GPT(**gpt_args, rng=np.random.default_rng(3), dtype=np.float64).forward(tokens[0]), tokens[1])
# a slow device and a fast link, so that compute and the three kinds of traffic are all visible
losses, trace = run_traced(gpt_step, 8, device=Device(flops=1e9), link=LinkModel(alpha=1e-6, beta=1 / 5e9))
(grid_loss,) = set(losses)                     # the same bits on every rank
print(f"2 data × 2 pipeline × 2 tensor: loss {grid_loss:.12f}, one process {expected_loss:.12f}")
assert abs(grid_loss - expected_loss) < 1e-12
ax = plot_timeline(trace, title="one step of a GPT on data 2 × pipeline 2 × tensor 2 (ranks (d·2 + p)·2 + q)")
ax.figure.tight_layout()
save_figure(ax.figure, "19_grid_timeline.png")
plt.close(ax.figure)
print("Chrome trace (open in Perfetto):", trace.save_chrome(figures_dir() / "19_grid_trace.json"))

# %% [markdown]
# Two more axes: context (ring attention) and **expert**, w = (((d·P + p)·c + k)·e + j)·t + q. A Switch
# Transformer's E experts are spread over an expert group, tokens sent to them by all-to-all (lesson 18).
# An expert's gradient already sums its group's tokens, the replicated weights' do not: `expert_parallel`
# lists the expert group in their `partial_over`, and they are summed over it once the pipeline's table has
# run, then the data group sums all — here as ZeRO-1. Expert 2 × data 2 × pipeline 2, two steps, tokens
# dropped at capacity 1: one process routing the same 8 groups (4 token sets × 2 micro-batches) gives the
# same losses, cross-entropy plus router losses (what `train_step` returns).

# %%
switch_args = dict(gpt_args, num_experts=2, d_ff=16, capacity_factor=1.0, z_loss_coef=1e-3, groups=8)


def switch_steps(comm):
    model = SwitchTransformer(**switch_args, rng=np.random.default_rng(3), dtype=np.float64)
    trainer = parallelize(model, Mesh(comm, data=2, pipeline=2, expert=2), loss_fn=CrossEntropyLoss(),
                          optimizer=lambda params: AdamW(params, lr=0.01), micro_batches=2, schedule="1f1b",
                          zero=1)
    return [trainer.train_step(tokens[0], tokens[1]) for _ in range(2)]


one = SwitchTransformer(**switch_args, rng=np.random.default_rng(3), dtype=np.float64)
one_opt, loss_fn, expected = AdamW(one.parameters(), lr=0.01), CrossEntropyLoss(), []
for _ in range(2):                             # backward adds the router losses' gradients
    one.zero_grad()
    expected.append(loss_fn.forward(one.forward(tokens[0]), tokens[1]) + one.router_loss)
    one.backward(loss_fn.backward())
    one_opt.step()
steps, trace = run_traced(switch_steps, 8, device=Device(flops=1e9), link=LinkModel(alpha=1e-6, beta=2e-10))
assert all(rank_losses == steps[0] for rank_losses in steps)     # the same bits on every rank
print(f"expert 2 × data 2 × pipeline 2, ZeRO-1: losses {steps[0]}, one process {expected}")
assert np.allclose(steps[0], expected, rtol=1e-12, atol=0)
print("its Chrome trace (the experts between the F and B tasks; the all-to-alls as sends):",
      trace.save_chrome(figures_dir() / "19_grid_expert_trace.json"))

# %% [markdown]
# ## 4. The planner
#
# `minidist.plan` enumerates every layout dp · ep · pp · tp · cp = D (ZeRO stages and no, selective or full
# recomputation as options), sets aside what does not divide (heads by tp, layers by pp, ...), what
# parallelize refuses and what does not fit, and ranks the rest by predicted step time. Memory per rank at
# the step's peak moment: 16 bytes per parameter (2 + 2 + 12, the ZeRO paper) as ZeRO shards them, the
# activations (FlashAttention's) in flight and the loss's logits (lesson 14). Time: every op on the GPU's
# achieved roofs (lesson 21), the bubble, each group's collectives on its link. First a laptop-sized model
# on two V100 nodes of 4; the last columns, tokens/s and model TFLOP/s per GPU and MFU, are under the table:

# %%
small = ModelSpec(layers=4, d_model=256, heads=8, seq=256, batch=32, vocab=4096)
v100s = hardware("v100", 8, 4)
print(format_plan(small, plan(small, v100s), top=6, hw=v100s))

# %% [markdown]
# Then real sizes, on A100 nodes of 8: Llama-2's 7B and 70B shapes (32 layers, d = 4096, 32 heads; 80
# layers, d = 8192, 64 heads), sequences of 4096 tokens, 1024 sequences per step: Llama 2's batch of 4M
# tokens. The planner's MLP has two matrices, so d_ff is 1.5× the SwiGLU width (the same weights); its
# attention has as many key/value heads as query heads (no grouped-query attention), which makes the second
# model 78B rather than 70B. Beside each answer, what was published (`minidist/plan/published.py`, each
# number with its source): Llama 2 (Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat
# Models") was trained on 2.0T tokens on A100-80GB GPUs in 184,320 (7B) and 1,720,320 (70B) GPU hours —
# tokens per second per GPU follow; the layout was not reported.

# %%
llama7 = ModelSpec(layers=32, d_model=4096, heads=32, seq=4096, batch=1024, vocab=32000, d_ff=11008 * 3 // 2)
llama70 = ModelSpec(layers=80, d_model=8192, heads=64, seq=4096, batch=1024, vocab=32000, d_ff=28672 * 3 // 2)
best, ratio = {}, {}
for label, model in (("7B", llama7), ("70B", llama70)):
    published = RUNS[f"llama2-{label.lower()}"]
    print(f"{label}: {model.total_params() / 1e9:.1f}B parameters, 16 bytes each = "
          f"{16 * model.total_params() / 1e9:.0f} GB. Llama 2 {label} as published: "
          f"{published.derived_tokens_per_gpu_second():.0f} tokens/s per GPU, "
          f"MFU {published.derived_mfu():.0%}")
    for devices in (64, 256, 1024):
        predictions = plan(model, hardware("a100", devices, 8), zero=(0, 1),
                           recompute=("none", "selective", "full"))
        runnable = [p for p in predictions if p.excluded is None]
        top = best[label, devices] = runnable[0]
        tokens = model.batch * model.seq / (devices * top.time["total"])
        ratio[label, devices] = tokens / published.derived_tokens_per_gpu_second()
        mfu = model.flops_per_token() * model.batch * model.seq / (devices * 312e12 * top.time["total"])
        print(f"  {devices:>5} A100s: {top.layout.name():<18} ZeRO {top.layout.zero}, "
              f"{top.layout.recompute:<9} {top.memory['total'] / 1e9:5.1f} GB/rank, step "
              f"{top.time['total']:6.2f} s, {tokens:5.0f} tokens/s per GPU ({ratio[label, devices]:.1f}× "
              f"Llama 2's), MFU {mfu:.0%}; {len(runnable)} of {len(predictions)} layouts run")

# %%
alone = predict_memory(llama70, Layout(dp=64))
assert alone["total"] > 16 * llama70.total_params() > 80e9          # 70B never fits by data parallelism alone
assert all(best["70B", d].layout.tp * best["70B", d].layout.pp > 1 for d in (64, 256, 1024))
assert all(p.memory["total"] <= 80e9 for p in best.values())
assert best["7B", 1024].time["total"] < best["7B", 64].time["total"]
assert all(0.7 < ratio[label, 1024] < 1.3 for label in ("7B", "70B")) and min(ratio.values()) > 0.7

# %% [markdown]
# The planner prices each op at what the GPU achieves (the matmuls below peak, attention at FlashAttention's
# measured speed, the elementwise passes and the optimizer by their bytes) and hides nothing behind anything;
# published end-to-end runs reach 40–56% of peak: about 41% and 43% for Llama 2 (derived above), 41.5% (22B)
# to 56.3% (1T) in Megatron-LM's README (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
# Transformer Models"), 52% for the 1T model of Narayanan et al. 2021. On 1024 A100s (LLaMA-65B trained on
# 2048) it lands within 30% of Llama 2's tokens/s; on 64 it is more optimistic: no stragglers, no restarts.
#
# Where a layout *was* published, the planner can say whether it fits. NVIDIA's NeMo Framework 24.09
# "Performance Summary" ran LLAMA2-7B on 8 GPUs (TP 1, PP 1) and LLAMA2-70B on 64 (TP 4, PP 4, 20 virtual
# stages), 128 sequences of 4096 per step; it does not say which optimizer sharding or recomputation.

# %%
for name, model in (("nemo-llama2-7b", llama7), ("nemo-llama2-70b", llama70)):
    run_, model, fits = RUNS[name], replace(model, batch=128), {}
    for zero, recompute in ((0, "none"), (1, "selective")):
        lay = Layout(dp=run_.gpus // (run_.tp * run_.pp), pp=run_.pp, tp=run_.tp, zero=zero,
                     recompute=recompute, schedule="interleaved" if run_.virtual_stages else "1f1b",
                     chunks=run_.virtual_stages or 2)
        fits[zero, recompute] = predict_memory(model, lay)["total"]
    print(f"{run_.model} on {run_.gpus} GPUs as {lay.name()}: {run_.tokens_per_gpu_second} tokens/s per GPU "
          f"published (FP8); planner: {fits[0, 'none'] / 1e9:.0f} GB/rank plain, "
          f"{fits[1, 'selective'] / 1e9:.0f} GB/rank with ZeRO-1 and selective recomputation")
    assert fits[1, "selective"] < 80e9 < fits[0, "none"]   # it fits an 80 GB device only with both
mega = RUNS["megatron-1t"]
print("Megatron-LM's README, model FLOPs utilisation at data parallel 1: "
      + ", ".join(f"{size} {mfu:.1%}" for size, mfu in MEGATRON_MFU.items())
      + f"; Narayanan et al. 2021: 1T on {mega.gpus} A100s at {mega.model_tflops_per_gpu:.0f} TFLOP/s per "
      f"GPU ({mega.mfu:.0%} of peak)")

# %% [markdown]
# ## 5. The planner checked against the cluster
#
# The planner above prices a GPU job (16-bit activations, compute at the roof). To check it against a run
# it needs a *minidist mode* (`minidist/plan/minidist_mode.py`) that prices what minidist does: float64
# weights, gradients and AdamW's m and v (32 bytes per parameter), the activations minidist's layers keep
# (the plain block stores its b·a·T² probabilities, 8·b·T bytes of token ids, ...), each unit's FLOPs /
# the device's rate, α + β·n per message, every collective's rounds (`minidist.sim.collective_cost`), ring
# attention's steps as max(K|V transfer, the block's compute), Chimera's exchange of its replicated stages'
# gradients, and the bubble of the table itself, walked in the cluster's event order rather than
# (P − 1)/(M + P − 1): the tiny GPT's stages are far from equal. `minidist/plan/check.py` lists every
# layout of that GPT that runs on ≤ 8 ranks — data × pipeline × context × tensor under 1F1B, interleaved,
# ZB-H1 and Chimera: 73 of them, each with its fewest micro-batches (the test also runs every other count:
# 171 layouts) — and 30 of a Switch model with an expert group of 2 (`minidist_switch.py`: all-to-alls,
# experts' rows; every token goes to both experts, so the bytes are known without running). It runs one
# AdamW step of each and measures each rank's simulated seconds, the model states `held_bytes` counts and
# the most activation bytes held after any task (`python -m minidist plan --mode minidist ... --measure`).

# %%
from minidist.plan.check import compare, runnable_layouts  # noqa: E402
from minidist.plan.check_figure import plot_check  # noqa: E402
from minidist_course.questions import check_yourself  # noqa: E402

check_spec = ModelSpec(layers=2, d_model=8, heads=2, seq=8, batch=8, vocab=11)
switch_spec = ModelSpec(layers=2, d_model=8, heads=2, seq=8, batch=8, vocab=11, d_ff=16, experts=2, top_k=2)
slow, fast = Device(flops=1e9), LinkModel(alpha=1e-6, beta=1 / 5e9)
points = {}   # per layout, its ranks' (predicted s, measured s, predicted peak, measured peak bytes)
for spec in (check_spec, switch_spec):
    points.update(compare(spec, runnable_layouts(spec, fewest_micro_batches=True), slow, fast))
layouts = list(points)
worst_time = max(abs(m / p - 1) for pts in points.values() for p, m, _, _ in pts)
worst_memory = max(abs(m / p - 1) for pts in points.values() for _, _, p, m in pts)
contexts = sum(lay.context > 1 for lay in layouts)
chimeras = sum(lay.schedule == "chimera" for lay in layouts)
experts = sum(lay.expert > 1 for lay in layouts)
print(f"{sum(map(len, points.values()))} ranks in {len(layouts)} layouts ({contexts} with a context group, "
      f"{chimeras} under Chimera, {experts} with an expert group): step time off by at most "
      f"{worst_time:.1e}, peak memory by at most {worst_memory:.1e} (the issue asks for 5% and 2%)")
assert experts == 30 and worst_time < 1e-9 and worst_memory == 0

fig = plot_check(points)   # minidist/plan/check_figure.py: one marker per rank, the diagonal is exact
save_figure(fig, "19_predicted_vs_measured.png")
plt.close(fig)

# %% [markdown]
# The planner prices a step without overlap, each op at its achieved roof (a one-GPU step within 15% of
# one measured on an H100, benchmarks/planner_gpu.md), exposed communication an upper bound. It gets the
# shape right: which layouts fit (NeMo's 70B only with a sharded optimizer and selective recomputation),
# how memory splits, which groups stay inside a node. Section 5's exactness checks the planner's arithmetic
# against the executed schedule on the same simulated clock (one cost model on both sides), not a wall clock.
#
# ## What to remember
#
# The pipeline bubble shrinks by cutting the work finer (interleaving), by filling it with work nobody
# waits for (zero-bubble: the weight gradients), or by running two pipelines into each other (Chimera:
# one's fill is the other's drain, for twice the weights). A layout is five numbers; what it costs follows
# from the formulas of the lessons before, here checked against the cluster.
#
# ## Exercises
#
# * `interleaved_orders` — `minidist/parallel/pipeline/interleaved.py`: each rank's task order under
#   Megatron's interleaved 1F1B (warm-up forwards, then one forward and one backward, then the drain).
#   Check: `python -m pytest --exercise interleaved_orders`.

# %%
# Check yourself (`python -m minidist exercises questions --lesson 19`): the answers, asserted.
spec = ModelSpec(layers=40, d_model=5120, heads=40, seq=2048, batch=256, vocab=32000)    # 13B
top = plan(spec, hardware("a100", 8, 8, memory=40e9), zero=(0, 1), recompute=("none", "selective"))[0].layout
v3, zero1 = bubble_fraction(interleaved_schedule(4, 8, 3), 4), predict_memory(spec, Layout(dp=8, zero=1))
same_1f1b = next(m for m in range(1, 99) if bubble_fraction(one_f_one_b_schedule(4, m), 4) <= v3 + 1e-12)
check_yourself("19", layout_for_13b=(top.name(), f"ZeRO-{top.zero}", top.recompute, zero1["total"] / 1e9),
               interleaved_bubble=v3, equivalent_micro_batches=same_1f1b)
