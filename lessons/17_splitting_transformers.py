# %% [markdown]
# # 17 — Splitting a transformer: heads, the sequence, and the vocabulary
#
# **Goal.** Lesson 09 split a Linear layer and Megatron's MLP. A transformer block has more to cut, and
# the systems that train large language models cut it three more ways:
#
# 1. **tensor parallelism of attention** (Megatron-LM, Shoeybi et al. 2019 — Goel's "Scaling Up Training"
#    slides list it under "Lots More To Read"): heads are independent, so each of t
#    ranks runs h/t of them; with the MLP split the same way, a block needs one all-reduce forward and one
#    backward per sub-layer;
# 2. **sequence parallelism** (Korthikanti et al. 2022): the LayerNorms and residual adds between the split
#    regions run on T/t tokens per rank; the all-reduce becomes an all-gather plus a reduce-scatter —
#    the same bytes — and the activation memory of those regions falls by t;
# 3. **context parallelism / ring attention** (Liu et al. 2023): the whole sequence is split over c ranks;
#    key/value blocks travel round a ring and partial results merge by the online softmax.
#
# Plus the **vocabulary-parallel cross-entropy**: a loss over V classes without ever gathering the logits.
# Every claim below is checked against one process and against the closed forms in
# `minidist/parallel/tensor/transformer_cost.py` and `minidist/parallel/context/cost.py`.

# %%
import copy

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from minidist.cluster import Device, LinkModel, run
from minidist.collectives import sum_partial_gradients
from minidist.nn import TransformerBlock
from minidist.nn.blockwise_attention import block_attention
from minidist.optim import AdamW
from minidist.parallel.context import RingAttention, context_parallel, merge, positions, shard
from minidist.parallel.context.cost import causal_work, crossover_seq_len, ring_traffic, step_seconds
from minidist.parallel.tensor import VocabParallelCrossEntropy, feature_slice, sequence_shard, tensor_parallel
from minidist.parallel.tensor.transformer_cost import block_bytes_sent, block_comm_seconds
from minidist.sim.collective_cost import collective_seconds
from minidist.sim.memory import held_bytes
from minidist.sim.plots import figures_dir, save_figure
from minidist_course.questions import check_yourself

FIGURES = figures_dir()
B, T, D, HEADS = 2, 8, 12, 4

# %% [markdown]
# ## 1. Where each split cuts a block
#
# A pre-LayerNorm block is `h = x + attn(ln1(x))`, `y = h + mlp(ln2(h))`. The picture shows, for 4 ranks,
# which rank holds which part of two activations: the (T × d) input of a LayerNorm, and the (T × d)
# output of attention's q projection (channels = heads side by side). Grey: every rank holds a copy.

# %%
ranks = 4
owner_ln = {"tensor": np.full((16, 12), -1),
            "tensor + sequence": np.repeat(np.arange(ranks), 4)[:, None] * np.ones((1, 12), int),
            "context (zigzag)": np.zeros((16, 12), int)}
owner_q = {"tensor": np.ones((16, 1), int) * np.repeat(np.arange(ranks), 3)[None, :],
           "tensor + sequence": np.ones((16, 1), int) * np.repeat(np.arange(ranks), 3)[None, :],
           "context (zigzag)": np.zeros((16, 12), int)}
for r in range(ranks):
    owner_ln["context (zigzag)"][positions(16, ranks, r, "zigzag")] = r
    owner_q["context (zigzag)"][positions(16, ranks, r, "zigzag")] = r
cmap = ListedColormap(["0.85", "tab:blue", "tab:orange", "tab:green", "tab:red"])
fig, axes = plt.subplots(2, 3, figsize=(9, 5.6), sharex=True, sharey=True)
for col, name in enumerate(owner_ln):
    for row, (grid, what) in enumerate(((owner_ln, "LayerNorm input"), (owner_q, "q = x·W_qᵀ"))):
        ax = axes[row, col]
        ax.imshow(grid[name] + 1, cmap=cmap, vmin=0, vmax=4, aspect="auto")
        ax.set_title(f"{name}: {what}", fontsize=9)
        ax.set_xlabel("channel (3 per head)") if row == 1 else None
        ax.set_ylabel("token position") if col == 0 else None
        ax.set(xticks=range(0, 12, 3), yticks=range(0, 16, 2))     # whole channels and positions
handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(i)) for i in range(5)]
fig.legend(handles, ["all ranks"] + [f"rank {r}" for r in range(ranks)], loc="lower center", ncol=5)
fig.tight_layout(rect=(0, 0.06, 1, 1))
save_figure(fig, "17_who_holds_what.png")
plt.close(fig)
assert all(set(np.unique(owner_q[n])) == set(range(ranks)) for n in owner_q)

# %% [markdown]
# ## 2. Each split trains exactly like one process
#
# Two blocks, three AdamW steps, mean-squared error against a target, float64. Tensor parallelism
# holds a slice of q/k/v and of the MLP on each rank; sequence parallelism additionally cuts the tokens;
# context parallelism keeps whole weights but only its tokens. After training, every rank's parameters
# must equal the matching slice of the single-process parameters.

# %%
rng = np.random.default_rng(1)
batches = [(rng.standard_normal((B, T, D)), rng.standard_normal((B, T, D))) for _ in range(3)]


def make_blocks():
    g = np.random.default_rng(0)
    return [TransformerBlock(D, HEADS, rng=g, dtype=np.float64) for _ in range(2)]


def train(blocks, cut=lambda a: a):
    optimizer = AdamW([p for b in blocks for p in b.parameters()], lr=0.01, weight_decay=0.1)
    for x, target in batches:
        optimizer.zero_grad()
        y = cut(x)
        for block in blocks:
            y = block.forward(y)
        dy = 2 * (y - cut(target)) / target.size
        for block in reversed(blocks):
            dy = block.backward(dy)
        sum_partial_gradients([p for b in blocks for p in b.parameters()])  # replicas saw only their tokens
        optimizer.step()
    return blocks


def split_train(comm, how):
    p, r = comm.world_size, comm.rank
    if how == "context":
        blocks = [context_parallel(b, comm, seq_len=T, layout="zigzag") for b in make_blocks()]
        train(blocks, lambda a: shard(a, p, r, "zigzag", axis=1))
        return [b.ln1.weight.data for b in blocks], [b.attn.qkv.weight.data for b in blocks]
    sp = how == "sequence"
    blocks = [tensor_parallel(b, comm, sequence_parallel=sp) for b in make_blocks()]
    train(blocks, (lambda a: sequence_shard(a, p, r)) if sp else (lambda a: a))
    return [b.ln1.weight.data for b in blocks], [b.attn.qkv.weight.data for b in blocks]


reference = train(make_blocks())
for how in ("tensor", "sequence", "context"):
    for p in (2, 4):
        worst = 0.0
        for r, (ln, qkv) in enumerate(run(split_train, p, how)):
            heads = feature_slice(HEADS, p, r)
            cols = np.arange(heads.start * 3, heads.stop * 3)
            rows = np.concatenate([cols, D + cols, 2 * D + cols]) if how != "context" else np.arange(3 * D)
            for i, block in enumerate(reference):
                for got, want in ((ln[i], block.ln1.weight.data), (qkv[i], block.attn.qkv.weight.data[rows])):
                    worst = max(worst, float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-12))))
        print(f"{how:>8} parallel, {p} ranks: largest relative difference from one process {worst:.1e}")
        assert worst < 1e-9

# %% [markdown]
# Each split is a *transform*: `tensor_parallel(model, group)` and `context_parallel(model, group)` swap
# sub-modules of the one `nn.TransformerBlock` (or `nn.GPT`) in place — split linears, ring attention as
# attention's core — and mark every parameter whose gradient covers only this rank's tokens as *partial*
# (`p.partial_over`); one sum over those groups after backward (`sum_partial_gradients`, or the gradient
# sync attachment) completes them. So the splits compose. On a 2 × 2 grid of ranks, each *tensor* group of
# 2 shares a piece of the sequence and splits the heads; each *context* group of 2 holds the same heads and
# passes K/V blocks round its ring: `tensor_parallel(context_parallel(block, cp, seq_len=T), tp)`.
# The same two calls split a whole `nn.GPT` (tests/parallel/test_parallel_*_gpt*.py).
#
# The sum is not optional: a backward's `p.grad += dW` marks a partial gradient *pending*, and every
# optimizer refuses to step on it until `sum_partial_gradients` (or the gradient sync) has run — else each
# rank would train on its own tokens. What a loop that forgets it meets, and the one call that fixes it:


# %%
def step_without_the_sum(comm):
    block = tensor_parallel(make_blocks()[0], comm, sequence_parallel=True)   # LayerNorms see T/t tokens
    optimizer, refused = AdamW(block.parameters(), lr=0.01), None
    block.backward(np.ones_like(block.forward(sequence_shard(batches[0][0], comm.world_size, comm.rank))))
    try:
        optimizer.step()
    except ValueError as refusal:
        refused = str(refusal)
    sum_partial_gradients(block.parameters())      # the one call that sums them
    optimizer.step()                               # accepted now
    return refused


refused = run(step_without_the_sum, 2)[0]
print(refused)
assert refused is not None and "params[0] ('ln1.weight'" in refused and "sum_partial_gradients(" in refused


# %%
def grid_train(comm, t):
    ci, ti = comm.rank // t, comm.rank % t
    tp, cp = comm.split(ci, key=ti), comm.split(ti, key=ci)           # tensor groups, context groups
    blocks = [tensor_parallel(context_parallel(copy.deepcopy(b), cp, seq_len=T), tp) for b in make_blocks()]
    train(blocks, lambda a: shard(a, comm.world_size // t, ci, "zigzag", axis=1))
    heads = feature_slice(HEADS, t, ti)
    cols = np.arange(heads.start * 3, heads.stop * 3)
    rows = np.concatenate([cols, D + cols, 2 * D + cols])
    return max(float(np.max(np.abs(b.attn.qkv.weight.data - ref.attn.qkv.weight.data[rows])))
               for b, ref in zip(blocks, reference))


worst = max(run(grid_train, 4, 2))
print(f"tensor × context, 2 × 2 ranks: largest difference of a qkv weight from one process {worst:.1e}")
assert worst < 1e-12

# %% [markdown]
# ## 3. The online softmax and the vocabulary-parallel loss
#
# Attention to a block of keys gives a partial output O and the log of its softmax denominator, lse.
# Two partial results over disjoint keys merge exactly: lse = log(e^lse₁ + e^lse₂),
# O = e^(lse₁−lse)·O₁ + e^(lse₂−lse)·O₂. The same trick gives the cross-entropy over a vocabulary split
# across t ranks: all-reduce the max m, then S = Σ exp(z − m), then the target's logit:
# loss = log S + m − z_target — three all-reduces of one number per token instead of gathering N·V logits.

# %%
q, k, v = (np.random.default_rng(s).standard_normal((1, 2, 5, 4)) for s in (2, 3, 4))
whole = block_attention(q, k, v)
halves = merge(*block_attention(q, k[:, :, :2], v[:, :, :2]), *block_attention(q, k[:, :, 2:], v[:, :, 2:]))
assert np.allclose(halves[0], whole[0], rtol=1e-13) and np.allclose(halves[1], whole[1], rtol=1e-13)
print("online-softmax merge of two key blocks == attention over all keys")

N, V = 64, 1000
logits = 5 * np.random.default_rng(5).standard_normal((N, V))
target = np.random.default_rng(6).integers(0, V, N)
shifted = logits - logits.max(axis=1, keepdims=True)
one_process = float(np.mean(np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(N), target]))


def vocab_loss(comm):
    loss_fn = VocabParallelCrossEntropy(comm, V)
    return (loss_fn.forward(logits[:, feature_slice(V, comm.world_size, comm.rank)], target),
            comm.stats.bytes_sent)


for t in (2, 4, 8):
    loss, sent = run(vocab_loss, t)[0]
    gather_bytes = (t - 1) * N * V // t * 8
    print(f"t = {t}: loss {loss:.6f} (one process {one_process:.6f}); sent {sent} bytes per rank, "
          f"an all-gather of the logits would send {gather_bytes}")
    assert abs(loss - one_process) < 1e-12 * abs(one_process)
    assert sent == 6 * (t - 1) * N // t * 8 and sent * V // 6 == gather_bytes

# %% [markdown]
# ## 4. Bytes per step and activation memory per rank
#
# Per block and step, tensor parallelism sends 4 all-reduces of B·T·d words: 8(t−1)/t·B·T·d. Sequence
# parallelism sends the same (plus 2(t−1)/t·6d for the token-wise parameters' gradients). Context
# parallelism sends K and V round the ring, (6c−4)/c·B·T·d, plus one all-reduce of the block's Ψ
# gradients, 2(c−1)/c·Ψ. The memory ledger measures what each rank keeps after forward.


# %%
def measure(comm, how):
    block, p, r = make_blocks()[0], comm.world_size, comm.rank
    x = np.random.default_rng(7).standard_normal((B, T, D))
    if how == "context":
        split = context_parallel(block, comm, seq_len=T, layout="zigzag")
        x = shard(x, p, r, "zigzag", axis=1)
    else:
        split = tensor_parallel(block, comm, sequence_parallel=how == "sequence")
        x = sequence_shard(x, p, r) if how == "sequence" else x
    start = comm.stats.bytes_sent
    split.backward(np.ones_like(split.forward(x)))
    sum_partial_gradients(split.parameters())
    ln = held_bytes(model=split.ln1)["activations"] + held_bytes(model=split.ln2)["activations"]
    return comm.stats.bytes_sent - start, held_bytes(model=split)["activations"], ln


sizes, table = (1, 2, 4), {}
for how in ("tensor", "sequence", "context"):
    table[how] = [run(measure, p, how)[0] for p in sizes]
psi = sum(p.data.size for p in make_blocks()[0].parameters())
for i, p in enumerate(sizes):
    assert table["tensor"][i][0] == block_bytes_sent(B, T, D, p, 8, False)
    assert table["sequence"][i][0] == block_bytes_sent(B, T, D, p, 8, True)
    ring = ring_traffic(T, p, 0, B, HEADS, D // HEADS, 8, "zigzag")
    assert table["context"][i][0] == (ring["forward_bytes"] + ring["backward_bytes"]
                                      + 2 * (p - 1) * psi // p * 8)
    assert table["sequence"][i][2] * p == table["tensor"][0][2]          # LayerNorm regions: ÷ t
    print(f"{p} ranks: bytes sent per block {table['tensor'][i][0]:>6} (tensor) {table['sequence'][i][0]:>6} "
          f"(+sequence) {table['context'][i][0]:>6} (context); activations kept {table['tensor'][i][1]:>6} "
          f"{table['sequence'][i][1]:>6} {table['context'][i][1]:>6} bytes")

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
for how, marker in (("tensor", "o"), ("sequence", "s"), ("context", "^")):
    label = {"tensor": "tensor", "sequence": "tensor + sequence", "context": "context (ring)"}[how]
    ax1.plot(sizes, [row[0] / 1e3 for row in table[how]], marker=marker, label=label)
    ax2.plot(sizes, [row[1] / 1e3 for row in table[how]], marker=marker, label=label)
for ax, what in ((ax1, "kB sent per rank, one block fwd+bwd"), (ax2, "kB of activations kept per rank")):
    ax.set_xticks(sizes)
    ax.set_xlabel("ranks (t or c)")
    ax.set_ylabel(what)
    ax.set_ylim(bottom=0)
ax1.legend()
fig.suptitle(f"B={B}, T={T}, d={D}, {HEADS} heads, float64 (measured)")
fig.tight_layout()
save_figure(fig, "17_bytes_and_memory.png")
plt.close(fig)

# %% [markdown]
# ## 5. The zigzag balances causal attention on the clock
#
# Under the causal mask, a query at position p sees p+1 keys. The naive split gives the last rank
# (2c−1)× the first rank's work; the zigzag (rank i holds chunks i and 2c−1−i) gives every rank exactly
# T(T+1)/(2c) query–key pairs. The ring moves in lock step, so the busiest rank sets the pace.

# %%
C, LONG = 4, 256
device = Device(flops=1e9)                       # a slow device, so compute dominates the tiny transfers


def ring_forward(comm, layout):
    attn = RingAttention(comm, LONG, causal=True, layout=layout, device=device)
    x = np.random.default_rng(8).standard_normal((1, 2, LONG, 8))
    attn.forward(*(shard(x, comm.world_size, comm.rank, layout),) * 3)
    return attn.compute_seconds, comm.clock


clock = {layout: run(ring_forward, C, layout, device=device) for layout in ("naive", "zigzag")}
work = {layout: causal_work(LONG, C, layout) for layout in clock}
assert len(set(work["zigzag"])) == 1 and work["naive"][-1] > (2 * C - 2) * work["naive"][0]
assert max(c for _, c in clock["zigzag"]) < 0.7 * max(c for _, c in clock["naive"])
fig, ax = plt.subplots(figsize=(7, 3.4))
for shift, layout in ((-0.2, "naive"), (0.2, "zigzag")):
    ax.bar(np.arange(C) + shift, [1e3 * s for s, _ in clock[layout]], width=0.4, label=f"{layout}: compute")
    ax.axhline(1e3 * max(c for _, c in clock[layout]), ls="--", color="C0" if layout == "naive" else "C1",
               label=f"{layout}: forward ends")
ax.set_xticks(range(C))
ax.set_xlabel("rank")
ax.set_ylabel("simulated ms")
ax.set_title(f"causal ring attention, T = {LONG}, c = {C}")
ax.legend(fontsize=8)
fig.tight_layout()
save_figure(fig, "17_zigzag_clock.png")
plt.close(fig)
print("forward ends (ms):", {k: round(1e3 * max(c for _, c in v), 3) for k, v in clock.items()})

# %% [markdown]
# ## 6. When does context parallelism beat tensor parallelism?
#
# At a realistic size (d = 4096, 32 heads, B = 1, 16-bit, 8 ranks, the default V100 and NVLink model):
#
# * tensor parallelism sends 8(t−1)/t·T·d per block, and none of it is hidden — the next layer needs
#   every sum: its time grows linearly with T (`block_comm_seconds`);
# * context parallelism sends K and V round the ring, (6c−4)/c·T·d, plus an all-reduce of the block's Ψ
#   weight gradients, 2(c−1)/c·Ψ, which does not depend on T. Each ring step hides its transfer behind the
#   block's attention compute, which grows as T²: past some T the ring costs nothing (`step_seconds`,
#   checked against the clock in the tests). Below, the gradient all-reduce is counted as exposed too
#   (it can overlap backward, as in data parallelism — then context parallelism wins even earlier).

# %%
d, heads, ranks, b, link = 4096, 32, 8, 2, LinkModel()
psi = 12 * d * d + 13 * d
lengths = [int(n) for n in 2 ** np.arange(10, 18)]
grad_bytes = 2 * (ranks - 1) * psi // ranks * b
tp_bytes = [block_bytes_sent(1, n, d, ranks, b, False) for n in lengths]
cp_bytes = [sum(ring_traffic(n, ranks, 0, 1, heads, d // heads, b, "naive")[k]
                for k in ("forward_bytes", "backward_bytes")) + grad_bytes for n in lengths]
tp_time = [block_comm_seconds(1, n, d, ranks, b) for n in lengths]
cp_time = []
for n in lengths:
    forward, backward = step_seconds(n, ranks, 1, heads, d // heads, b)
    compute = 3.5 * 4 * d * (n // ranks) ** 2 / Device().flops * ranks      # F + F_b per step, c steps
    cp_time.append(forward + backward - compute
                   + collective_seconds("pairwise", ranks, psi, b, link))
bytes_cross = next(n for n, x, y in zip(lengths, tp_bytes, cp_bytes) if y < x)
time_cross = next(n for n, x, y in zip(lengths, tp_time, cp_time) if y < x)
hidden = crossover_seq_len(ranks, 1, heads, d // heads, b)
assert tp_time[0] < cp_time[0] and tp_time[-1] > 5 * cp_time[-1] and time_cross < bytes_cross
print(f"context parallelism: fewer bytes than tensor parallelism from T = {bytes_cross}, less exposed "
      f"communication time from T = {time_cross}; its ring is hidden from T = {hidden} on")
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
ax1.loglog(lengths, np.array(tp_bytes) / 2**20, "o-", label="tensor (+ sequence), t = 8")
ax1.loglog(lengths, np.array(cp_bytes) / 2**20, "^-", label="context (ring), c = 8")
ax2.loglog(lengths, 1e3 * np.array(tp_time), "o-", label="tensor (+ sequence), t = 8")
ax2.loglog(lengths, 1e3 * np.array(cp_time), "^-", label="context (ring), c = 8")
ax2.axvline(hidden, color="0.5", ls=":", label="ring hidden behind compute")
for ax, what in ((ax1, "MiB sent per rank per block"), (ax2, "ms of exposed communication per block")):
    ax.set_xlabel("sequence length T")
    ax.set_ylabel(what)
    ax.legend(fontsize=8)
fig.tight_layout()
save_figure(fig, "17_crossover.png")
plt.close(fig)

# %% [markdown]
# **What to remember.** Heads, hidden units and vocabulary ids split cleanly because they never mix until
# a sum — one all-reduce per sub-layer. Sequence parallelism costs nothing extra on the wire and divides
# the LayerNorm regions' activations by t. Context parallelism splits the one dimension that grows with
# long contexts; the online softmax makes attention over a ring exact, and the zigzag keeps a causal
# ring in step.
#
# ## Exercises
#
# * `online_softmax_merge` — `minidist/parallel/context/ring.py: merge`. Check:
#   `python -m pytest --exercise online_softmax_merge`.
# * `vocab_parallel_cross_entropy` — the forward of `VocabParallelCrossEntropy` in
#   `minidist/parallel/tensor/vocab_parallel.py`. Check:
#   `python -m pytest --exercise vocab_parallel_cross_entropy`.

# %%
# Check yourself (`python -m minidist exercises questions --lesson 17`): the answers, asserted.
tp8, sp8 = (block_bytes_sent(1, 8192, 4096, 8, 2, sp) for sp in (False, True))
grad4 = 2 * 3 * (12 * 2048**2 + 13 * 2048) // 4 * 2        # c = 4, d = 2048: the block's gradients
ring4 = {n: sum(ring_traffic(n, 4, 0, 1, 16, 128, 2, "naive")[k] for k in ("forward_bytes", "backward_bytes"))
         for n in lengths}
check_yourself("17", tensor_block_bytes=tp8, sequence_parallel_extra=sp8 - tp8, context_crossover=next(
    n for n in lengths if ring4[n] + grad4 < block_bytes_sent(1, n, 2048, 4, 2, False)))
