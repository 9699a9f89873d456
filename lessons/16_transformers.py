# %% [markdown]
# # 16 — Transformers: attention by hand, FLOPs per token, activation memory, a tiny GPT on real text
#
# **Goal.** Build the model every later strategy (tensor, sequence, context, expert parallelism) splits:
# causal multi-head self-attention with its backward pass written out, a pre-LayerNorm block, and a small
# GPT. Count its training FLOPs per token (≈ 6N + 12·L·T·d) and check the formula against the matrix
# products actually executed; measure how a block's saved activations grow with the context length T
# (quadratically, through the attention probabilities); train it on real text in seconds; and show why
# the mixed-precision rule keeps softmax in FP32.
#
# Sources: the "Scaling Up Training" slides (GPT-3's 175B parameters, "175B parameters @ fp16"); the
# HOT CHIPS tutorial (language models as the reason training must scale); the NVIDIA mixed-precision
# slides in "Hardware Accelerators for Training DNNs": FP32 math for operations f with |f(x)| ≫ |x|
# ("Exp, Square, Log, Cross-entropy"), for reductions ("Softmax") and for "Loss, probability layers:
# Softmax, cross-entropy, attention modules: FP32 math, FP32 output".

# %%
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from threadpoolctl import threadpool_limits  # comes with scikit-learn

from minidist import nn
from minidist.data import load_text
from minidist.nn.gradcheck import gradcheck
from minidist.optim import AdamW
from minidist.precision import FP16
from minidist.precision.transformer import mixed_cross_entropy, mixed_forward
from minidist.sim.memory import MemoryLedger, record
from minidist.sim.plots import save_figure

threadpool_limits(limits=1, user_api="blas")  # small products: one BLAS thread is faster on a busy machine
START = time.perf_counter()

# %% [markdown]
# ## 1. Attention's data flow, forward and backward
#
# For x of shape (B, T, d) and h heads of d_k = d/h channels, one Linear makes q, k, v (its 3d outputs
# are q | k | v, each head a contiguous block of d_k columns), and per head
#
#     S = q·kᵀ/√d_k  (B, h, T, T),   S[i, j] = −∞ for j > i,   P = softmax(S),   O = P·v  (B, h, T, d_k)
#
# then the heads are put side by side and projected: y = O·W_projᵀ (B, T, d). The backward pass is the
# same products transposed — dv = Pᵀ·dO, dP = dO·vᵀ, dq = dS·k, dk = dSᵀ·q — with one new piece, the
# softmax backward: dS = P ⊙ (dP − Σ_j dP ⊙ P)/√d_k, the Jacobian diag(P) − P·Pᵀ applied row by row
# without ever forming the T×T Jacobian of every row (your exercise, in `minidist/nn/softmax.py`).

# %%
rng = np.random.default_rng(0)
attn = nn.CausalSelfAttention(8, 2, rng=rng, dtype=np.float64)
x = rng.standard_normal((2, 5, 8))
y = attn.forward(x)
print(f"x {x.shape} -> q, k, v per head {attn._q.shape} -> P {attn._probs.shape} -> y {y.shape}")
print("P of head 0, sample 0 (row i attends to positions <= i):")
print(np.array2string(attn._probs[0, 0], precision=2, suppress_small=True))
assert np.allclose(attn._probs.sum(-1), 1) and np.all(np.triu(attn._probs[0, 0], 1) == 0)

# causality: changing position 3 changes no output before it
x2 = x.copy()
x2[:, 3] += 1.0
assert np.array_equal(attn.forward(x2)[:, :3], y[:, :3])

errors = gradcheck(attn, x, rng)
print("finite differences vs backward, worst relative error:", f"{max(errors.values()):.1e}")
assert max(errors.values()) < 1e-6

# %% [markdown]
# ## 2. FLOPs per token: 6N + 12·L·T·d
#
# A weight matrix of a Linear layer with N_w entries costs 2·N_w FLOPs per token forward (a
# multiply-add each) and 4·N_w backward (dx and dW), so training costs 6N for the N weights that multiply
# activations (embedding lookups multiply nothing). Attention adds q·kᵀ and P·v: 2·T·d each per token and
# layer forward (T keys of d channels), three times that with backward — 12·L·T·d. Kaplan et al.'s Table 1
# ("Scaling Laws for Neural Language Models") lists 2·n_layer·n_ctx·d_attn per token *forward*, one
# product's worth; the 12 here is 2 (a multiply-add) × 2 (both q·kᵀ and P·v) × 3 (forward, plus backward's
# two products for each forward one), with nothing subtracted for the causal mask (our kernels compute
# the full T×T, as the count below shows). To check the formula
# we count what really runs: every `@` in forward and backward goes through NumPy's matmul ufunc, and an
# array subclass counts 2·(output size)·K for each product.


# %%
class Counted(np.ndarray):
    """An ndarray that adds 2·size(out)·K to Counted.flops for every matrix product it takes part in."""

    flops = 0

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        plain = [a.view(np.ndarray) if isinstance(a, Counted) else a for a in inputs]
        if out is not None:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, Counted) else o for o in out)
        result = getattr(ufunc, method)(*plain, **kwargs)
        if ufunc is np.matmul and method == "__call__":
            Counted.flops += 2 * result.size * plain[0].shape[-1]
        if out is not None:  # in place (y += b): hand back the caller's own array, still Counted
            return out[0] if len(out) == 1 else out
        return result.view(Counted) if isinstance(result, np.ndarray) else result


V, T_CTX, LAYERS, D, HEADS = 103, 64, 2, 128, 4
model = nn.GPT(V, T_CTX, LAYERS, D, HEADS, rng=np.random.default_rng(1), dtype=np.float64)
for p in model.parameters():
    p.data, p.grad = p.data.view(Counted), p.grad.view(Counted)
tokens = np.random.default_rng(2).integers(0, V, (2, T_CTX))
loss_fn = nn.CrossEntropyLoss()
Counted.flops = 0
loss_fn(model.forward(tokens[:, :-1]), tokens[:, 1:])  # inputs and next-token targets, T = 63
model.backward(loss_fn.backward())
counted_per_token = Counted.flops / (2 * (T_CTX - 1))
formula = model.flops_per_token(T_CTX - 1)
print(f"GPT d={D}, L={LAYERS}, T={T_CTX - 1}: N (matmul weights) = {formula['6N'] // 6:,}")
print(f"  formula 6N + 12·L·T·d = {formula['6N']:,} + {formula['attention']:,} = "
      f"{formula['total']:,} FLOPs/token")
print(f"  counted (forward + backward matmuls) = {counted_per_token:,.0f} FLOPs/token")
assert counted_per_token == formula["total"]
print(f"  attention's share at T = {T_CTX - 1}: {formula['attention'] / formula['total']:.1%}; "
      f"it equals 6N at T = {formula['6N'] / (12 * LAYERS * D):,.0f}")

# %% [markdown]
# ## 3. Activation memory per block against T
#
# Backward needs what forward computed: each Linear's input, the LayerNorms' normalised values, GELU's
# input, q, k, v — all proportional to B·T·d — and the attention probabilities P, B·h·T² numbers.
# The memory ledger measures what a block really holds after forward, by walking its saved arrays.

# %%
B_MEM, D_MEM, H_MEM = 4, 64, 4
block = nn.TransformerBlock(D_MEM, H_MEM, rng=np.random.default_rng(3))
ledger = MemoryLedger()
contexts = [32, 64, 128, 256, 512]
for t in contexts:
    block.forward(np.random.default_rng(t).standard_normal((B_MEM, t, D_MEM)).astype(np.float32))
    record(ledger, f"T={t}", block)
activations = np.array([held["activations"] for _, _, held in ledger.timeline])
quadratic = np.array([B_MEM * H_MEM * t * t * 4 for t in contexts])  # P in float32
linear = activations - quadratic
per_token = linear / (B_MEM * np.array(contexts))
for t, a, qd in zip(contexts, activations, quadratic):
    print(f"T = {t:4d}: activations {a / 2**20:7.2f} MiB, of which P (B·h·T²·4 bytes) {qd / 2**20:6.2f} MiB")
assert np.all(per_token == per_token[0])  # the rest is exactly linear in T
# per token: ln1 x̂ and 1/σ (d + 1), qkv's input (d) and output q|k|v (3d), proj's input (d), ln2 (d + 1),
# the MLP's first input (d), GELU's input and Φ(x) (4d + 4d), the second Linear's input (4d)
assert per_token[0] == 4 * (20 * D_MEM + 2)
print(f"linear part: {per_token[0]:.0f} bytes per token = 20·d + 2 float32 numbers (12·d of them in the MLP)")
assert quadratic[-1] > linear[-1]  # at T = 512 the scores outweigh everything else

fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
ax.plot(contexts, activations / 2**20, "o-", label="all saved activations (measured)")
ax.plot(contexts, quadratic / 2**20, "s--", label="attention probabilities B·h·T²")
ax.plot(contexts, linear / 2**20, "^:", label="the rest (linear in T)")
ax.set(xlabel="context length T", ylabel="MiB held after forward", xticks=contexts,
       title=f"one transformer block, B = {B_MEM}, d = {D_MEM}, h = {H_MEM}, float32")
ax.legend()
save_figure(fig, "16_activation_memory.png", dpi=90)
plt.close(fig)

# %% [markdown]
# ## 4. A tiny GPT on real text
#
# The corpus is the language reference every CPython carries for `help()` (`pydoc_data.topics`, no
# download): characters are tokens, the first 90 % trains and the last 10 % validates. The baseline is
# the unigram model — the training set's character frequencies, no context at all; anything below it has
# learnt something about order.

# %%
corpus = load_text()
unigram = corpus.unigram_loss()
print(corpus)
print(f"uniform guess ln V = {np.log(corpus.vocab_size):.3f} nats; unigram baseline {unigram:.3f} nats")

rng = np.random.default_rng(4)
T_TRAIN, B_TRAIN, STEPS = 32, 32, 200
gpt = nn.GPT(corpus.vocab_size, T_TRAIN, 2, 64, 4, rng=rng)
optimizer = AdamW(gpt.parameters(), lr=3e-3, weight_decay=0.01)
losses = []
t0 = time.perf_counter()
for _step in range(STEPS):
    inputs, targets = corpus.windows("train", B_TRAIN, T_TRAIN, rng)
    optimizer.zero_grad()
    losses.append(loss_fn(gpt.forward(inputs), targets))
    gpt.backward(loss_fn.backward())
    optimizer.step()
train_seconds = time.perf_counter() - t0
gpt.eval()
val_rng = np.random.default_rng(5)
val_batches = [corpus.windows("val", 64, T_TRAIN, val_rng) for _ in range(4)]
val_loss = float(np.mean([loss_fn(gpt.forward(vx), vy) for vx, vy in val_batches]))
print(f"{gpt.num_parameters():,} parameters, {STEPS} steps of {B_TRAIN}×{T_TRAIN} tokens "
      f"in {train_seconds:.1f} s")
print(f"training loss {np.mean(losses[:10]):.3f} -> {np.mean(losses[-10:]):.3f}; validation {val_loss:.3f} "
      f"(unigram {unigram:.3f})")
assert val_loss < unigram - 0.5

sample = gpt.generate(corpus.encode("The ")[None], 160, temperature=0.8, top_k=10,
                      rng=np.random.default_rng(6))
print("sample (temperature 0.8, top-k 10):\n" + corpus.decode(sample[0]))

fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
ax.plot(range(1, STEPS + 1), losses, lw=0.8, label="training batch loss")
ax.axhline(unigram, color="gray", ls="--", label=f"unigram baseline {unigram:.2f}")
ax.plot([STEPS], [val_loss], "o", color="C3", label=f"validation {val_loss:.2f}")
ax.set(xlabel="step", ylabel="cross-entropy (nats per character)", xlim=(1, STEPS + 5),
       title="tiny GPT (2 blocks, d = 64) on CPython's help() text")
ax.legend()
save_figure(fig, "16_training_loss.png", dpi=90)
plt.close(fig)

# %% [markdown]
# ## 5. Mixed precision: why softmax stays in FP32
#
# In FP16, e^x overflows once x > ln 65504 ≈ 11.09. Softmax with the max subtracted only ever takes
# e^(x − max) ≤ 1, but a naive FP16 softmax takes e^x of the raw scores, and a trained model's attention
# scores pass 11 easily: e^x becomes Inf, the row sum Inf, and Inf/Inf is NaN — which then flows through
# every later layer. `mixed_forward` runs the trained model with every matrix product in FP16 (operands
# rounded, FP32 accumulation, result rounded) and softmax, LayerNorm and the loss either by the rule (FP32)
# or in FP16 step by step.

# %%
vx, vy = val_batches[0]
reference = gpt.forward(vx)
largest_score = 0.0
for blk in gpt.blocks:  # the scores q·kᵀ/√d_k each block computed, masked entries excluded
    scores = blk.attn._q @ blk.attn._k.transpose(0, 1, 3, 2) / np.sqrt(blk.attn.d_head)
    largest_score = max(largest_score,
                        float(scores[..., ~np.triu(np.ones((T_TRAIN, T_TRAIN), bool), 1)].max()))
print(f"largest attention score of the trained model on a validation batch: {largest_score:.1f} "
      f"(e^x overflows FP16 past {np.log(FP16.max_normal):.2f})")
fp32_loss = loss_fn(reference, vy)
results = {}
for policy in ("rule", "lowp", "lowp-nomax"):
    logits = mixed_forward(gpt, vx, FP16, policy)
    results[policy] = (np.isnan(logits).mean(), np.abs(logits - reference).max() / np.abs(reference).max(),
                       mixed_cross_entropy(logits, vy, FP16, policy))
    print(f"{policy:11s} NaN logits {results[policy][0]:6.1%}  rel. error vs FP32 {results[policy][1]:.1e}  "
          f"loss {results[policy][2]:.4f} (FP32 {fp32_loss:.4f})")
assert largest_score > np.log(FP16.max_normal)
assert results["lowp-nomax"][0] > 0 and np.isnan(results["lowp-nomax"][2])
assert results["rule"][0] == 0 and results["rule"][1] < 5e-3 and abs(results["rule"][2] - fp32_loss) < 1e-3

# %% [markdown]
# **What to remember.** Attention is two batched matrix products around a softmax, and its backward is
# four more plus the softmax's Jacobian-vector product. Training costs ≈ 6N FLOPs per token plus
# 12·L·T·d for attention, exactly what the products executed add up to; the attention term and the
# B·h·T² probabilities kept for backward are what grows with the context — the reason for context
# parallelism and for recomputing attention instead of storing it. A two-block GPT learns English-like
# text from CPython's own documentation in seconds. In half precision, keep reductions and exponentials
# (softmax, LayerNorm, the loss) in FP32, and always subtract the max.
#
# ## Exercises
#
# * `softmax_backward` (minidist/nn/softmax.py): the backward pass of softmax, dx = y ⊙ (dy − Σ dy ⊙ y).
#   Check it with `python -m pytest --exercise softmax_backward`
#   (or `python -m pytest tests/nn/test_nn_softmax.py`).
# * Try: tie the head to the token embedding (`tie_weights=True`) and compare parameters and validation loss.
# * Try: train with `T_TRAIN = 8` and `64` and compare the validation loss (how much does context buy?).

# %%
print(f"lesson ran in {time.perf_counter() - START:.1f} s")
