# %% [markdown]
# # 28 — Precision beyond the MLP, and what "storage is quadratic in depth" means
#
# **Goal.** Lesson 03 trains the digits MLP in mixed precision. Here we check four more claims of the
# "Hardware Accelerators for Training DNNs" slides:
#
# 1. "Reductions — Examples: Large sums of values: L1 norm, L2 norm, Softmax — FP32 Math: Avoids
#    overflows": a gradient's L2 norm that is Inf when summed in FP16 and finite in FP32.
# 2. Mixed precision beyond convnets: the slides' "Mixed Precision Training Beyond Imagenet" table (GNMT,
#    Deep Speech 2, "Nvidia Sentiment (Language modeling)": "trained to same accuracy as FP32 model") and
#    "Adam (RNNs, Attention)". Micikevicius et al. ("Mixed Precision Training", 2018) train recurrent
#    networks with Adam this way: FP16 compute, FP32 master weights, loss scaling. We do it on an LSTM.
# 3. The slide "Storage is Quadratic Function of Depth", just before "Reverse Checkpointing — Recompute the
#    Activations from sparse snapshots": what the memory ledger says grows with depth, and how fast.
# 4. "Reduce Memory Consumption — Halve the size of activation and gradient tensors — Enables larger
#    minibatches or larger input sizes": the largest batch that fits a fixed memory budget, by the ledger.

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.nn import GELU, LSTM, Checkpoint, CrossEntropyLoss, Linear, Module, ReLU, Sequential
from minidist.nn.conv import Conv2d, Flatten, MaxPool2d
from minidist.nn.runner import Attachment
from minidist.optim import SGD, Adam
from minidist.precision import FP16, FP32
from minidist.precision.fp8_training import EnhancedLossScaler, clip_grad_norm_, fp8_trainer
from minidist.precision.mixed import MixedPrecisionTrainer
from minidist.sim.memory import MODEL_STATES, MemoryLedger, held_bytes, record
from minidist.sim.plots import save_figure

FP16_MAX = 65504.0

# %% [markdown]
# ## 1. An L2 norm that overflows in FP16
#
# ‖g‖ = √(Σ g_i²). Each g_i² fits FP16 while |g_i| < 256, but the *sum* passes 65,504 (FP16's largest
# value) long before the norm does: 8,192 entries of size ≈ 4 give Σ g_i² ≈ 131,000, so the FP16 running
# sum becomes Inf although ‖g‖ ≈ 362. In FP32 the sum is harmless. A second way out keeps the data in
# FP16 and scales first: ‖g‖ = m · ‖g / m‖ with m = max|g_i| (every |g_i / m| ≤ 1, so Σ (g_i/m)² ≤ n;
# this is LAPACK's nrm2 trick). It cures the overflow, not the rounding: once the FP16 running sum of
# 8,192 terms near 0.07 reaches a few hundred, half its ulp (0.25 at 512) swallows most of each term, so
# the scaled FP16 norm comes out finite but about 10 % low. The slides' rule, FP16 inputs with FP32 math
# and an FP32 output, gets both right. What minidist does: `clip_grad_norm_`
# (minidist/precision/fp8_training.py) squares and sums in float64 whatever the gradient's dtype
# (`np.square(g, dtype=np.float64)`), so it needs neither FP16 sums nor the scaling trick.

# %%
g16 = (4.0 * np.random.default_rng(0).standard_normal(8192)).astype(np.float16)
exact = float(np.sqrt(np.sum(g16.astype(np.float64) ** 2)))
with np.errstate(over="ignore"):
    running16 = np.cumsum(np.square(g16), dtype=np.float16)          # one FP16 addition after another
first_inf = int(np.argmax(np.isinf(running16)))
norm32 = float(np.sqrt(np.sum(np.square(g16.astype(np.float32)), dtype=np.float32)))
m = np.max(np.abs(g16))
scaled16 = float(m * np.sqrt(np.cumsum(np.square(g16 / m), dtype=np.float16)[-1]))
library = clip_grad_norm_([g16.copy()], max_norm=1e9)               # max_norm so large nothing is clipped
print(f"‖g‖ (float64) = {exact:.2f}: FP16 running sum Inf from entry {first_inf} on; FP32 {norm32:.2f}; "
      f"FP16 scaled by max|g| = {m}: {scaled16:.2f}; clip_grad_norm_ {library:.2f}")
assert np.isinf(running16[-1]) and running16[first_inf - 1] <= FP16_MAX and m < 256   # each g_i² fits
assert abs(norm32 - exact) < 1e-5 * exact
assert np.isfinite(scaled16) and 0.05 < (exact - scaled16) / exact < 0.15     # no Inf, but swamped terms
assert abs(library - exact) < 1e-9 * exact

# %% [markdown]
# ## 2. An LSTM with Adam: mixed precision against FP32
#
# The task: a sequence of T = 12 steps of 3 numbers; the class is the channel with the largest sum over
# time, read from the LSTM's last hidden state by a Linear head. `MixedPrecisionTrainer` runs forward and
# backward with FP16 weights and FP16 values at the layer boundaries (the LSTM's output, the logits, the
# gradients), scales the loss dynamically and lets Adam update FP32 masters. Three runs per seed: FP32,
# mixed (FP32 masters), and "pure FP16" (the same, but the masters rounded to FP16 after every update:
# `master_fmt=FP16`). The slides' "Weight Update" slide says what the last one risks: "if w >> lr · dw
# then update doesn't change w". Adam's step is about lr whatever the gradient, so with lr = 3·10⁻⁴ and
# weights of a few tenths (ulp 2⁻¹² ≈ 2.4·10⁻⁴ in [0.25, 0.5)) many steps round away.


# %%
class LastHidden(Module):
    """An LSTM's last hidden state: x (T, N, I) -> h_T (N, H); backward puts dy on the last step only."""

    def __init__(self, lstm: LSTM):
        self.lstm = lstm

    def forward(self, x: np.ndarray) -> np.ndarray:
        out, _ = self.lstm.forward(x)
        self.out_shape = out.shape
        return out[-1]

    def backward(self, dy: np.ndarray) -> np.ndarray:
        d_out = np.zeros(self.out_shape, dtype=dy.dtype)
        d_out[-1] = dy
        return self.lstm.backward(d_out)


T, BATCH, CHANNELS, HIDDEN, STEPS, LR = 12, 64, 3, 16, 300, 3e-4


def sequences(rng, n=BATCH):
    """x (T, n, CHANNELS) standard normal; label: the channel with the largest sum over time."""
    x = rng.standard_normal((T, n, CHANNELS)).astype(np.float32)
    return x, x.sum(axis=0).argmax(axis=1)


def train_lstm(seed: int, mode: str) -> tuple[float, float]:
    """Train in mode "fp32", "mixed" or "fp16 masters"; return (test loss, test accuracy) on 1,000
    fresh sequences."""
    init = np.random.default_rng(seed)
    model = Sequential(LastHidden(LSTM(CHANNELS, HIDDEN, rng=init)), Linear(HIDDEN, CHANNELS, rng=init))
    optimizer, loss_fn = Adam(model.parameters(), lr=LR), CrossEntropyLoss()
    trainer = None if mode == "fp32" else MixedPrecisionTrainer(
        model, optimizer, CrossEntropyLoss(), FP16, master_fmt=FP32 if mode == "mixed" else FP16)
    data = np.random.default_rng(100 + seed)
    for _ in range(STEPS):
        x, y = sequences(data)
        if trainer is None:
            optimizer.zero_grad()
            loss_fn.forward(model.forward(x), y)
            model.backward(loss_fn.backward())
            optimizer.step()
        else:
            trainer.train_step(x, y)
    x_test, y_test = sequences(np.random.default_rng(999), 1000)
    logits = model.forward(x_test)
    return float(loss_fn.forward(logits, y_test)), float(np.mean(logits.argmax(axis=1) == y_test))


MODES = ("fp32", "mixed", "fp16 masters")
results = {seed: {mode: train_lstm(seed, mode) for mode in MODES} for seed in range(3)}
for seed, r in results.items():
    runs = (f"{mode} loss {loss:.5f} acc {acc:.3f}" for mode, (loss, acc) in r.items())
    print(f"seed {seed}: " + ", ".join(runs))
for r in results.values():
    assert abs(r["mixed"][0] - r["fp32"][0]) < 1e-3 and abs(r["mixed"][1] - r["fp32"][1]) <= 0.005
    assert r["fp16 masters"][0] > r["mixed"][0]      # swamped updates: a little less progress
# Honest size of the effect: at this lr the FP16 masters lose ~0.002-0.005 of test loss, not a collapse;
# with lr = 10⁻² (updates far above half an ulp) the three runs agree to 10⁻³.

# %% [markdown]
# ## 3. "Storage is Quadratic Function of Depth": what grows, and how fast
#
# The slide is a title and a figure (from Rhu et al. 2016, via the Synced article it links), followed by
# "Reverse Checkpointing" and "Recompute the Activations from sparse snapshots — Trade most storage for one
# repeat of forwards pass compute". The ledger (`held_bytes`, minidist/sim/memory.py) measures a chain of n
# blocks Linear(64, 64) + ReLU, batch 32, after forward, three ways:
#
# - **store everything** (plain backprop): each block keeps its fp32 input and a 1-byte ReLU mask,
#   5 · 64 · 32 bytes; storage n · 10,240 bytes: *linear* in depth, exactly.
# - **√n checkpoints** (`Checkpoint` on each of √n segments of √n blocks, Chen et al. 2016): √n segment
#   inputs, √n · 8,192 bytes, for one extra forward pass.
# - **store nothing** but the input: to backpropagate block l, recompute blocks 1…l from x. O(1) storage
#   (one block's arrays at a time, were each dropped after use; `backward_storing_nothing` below only
#   counts the forwards), and n(n + 1)/2 block forwards: here the *quadratic* appears, as compute.
#
# So in this chain the ledger shows storage linear in depth, not quadratic; the quadratic is the price in
# recompute of storing nothing, which checkpointing cuts to one extra forward at √n storage. (A net whose
# block l keeps all l earlier outputs, as DenseNet's concatenations do, would store ∝ n²; a chain does
# not. The slide's figure itself is not in the seed text, so which of these it plots we cannot check.)

# %%
WIDTH, ROWS = 64, 32


def chain(n: int) -> list[Module]:
    rng = np.random.default_rng(n)
    return [layer for _ in range(n) for layer in (Linear(WIDTH, WIDTH, rng=rng), ReLU())]


def backward_storing_nothing(layers: list[Module], x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, int]:
    """Backpropagate through blocks kept nowhere: for l = n…1 recompute blocks 1…l from x, then block l's
    backward. Returns (dx, block forwards run, the first pass included)."""
    blocks, forwards = [layers[i:i + 2] for i in range(0, len(layers), 2)], 0
    for last in range(len(blocks), 0, -1):
        h = x
        for block in blocks[:last]:
            for layer in block:
                h = layer.forward(h)
            forwards += 1
        for layer in reversed(blocks[last - 1]):
            dy = layer.backward(dy)
    return dy, forwards


depths = [4, 9, 16, 25, 36]
x_in = np.random.default_rng(1).standard_normal((ROWS, WIDTH)).astype(np.float32)
plain_bytes, sqrt_bytes, recomputes = [], [], []
for n in depths:
    plain = Sequential(*chain(n))
    y = plain.forward(x_in)
    plain_bytes.append(held_bytes(plain)["activations"])
    k = int(np.sqrt(n))
    layers = chain(n)
    ckpt = Sequential(*[Checkpoint(Sequential(*layers[2 * k * s:2 * k * (s + 1)])) for s in range(k)])
    assert np.array_equal(ckpt.forward(x_in), y)
    sqrt_bytes.append(held_bytes(ckpt)["activations"])
    dy = np.ones_like(y)
    dx_plain = plain.backward(dy)
    dx_nothing, forwards = backward_storing_nothing(chain(n), x_in, dy)
    assert np.array_equal(dx_nothing, dx_plain)          # the same gradient, bitwise
    recomputes.append(forwards)
    print(f"n = {n:2d}: store everything {plain_bytes[-1]:7,} B, √n checkpoints {sqrt_bytes[-1]:6,} B, "
          f"store nothing: {forwards:3d} block forwards (plain: {n})")
assert plain_bytes == [n * ROWS * WIDTH * 5 for n in depths]                       # linear in n
assert sqrt_bytes == [int(np.sqrt(n)) * ROWS * WIDTH * 4 for n in depths]         # √n segment inputs
assert recomputes == [n * (n + 1) // 2 for n in depths]                           # quadratic in n

fig, (ax_mem, ax_fwd) = plt.subplots(1, 2, figsize=(9, 3.4))
ax_mem.plot(depths, np.array(plain_bytes) / 1024, "o-", label="store everything: ∝ n")
ax_mem.plot(depths, np.array(sqrt_bytes) / 1024, "s-", label="√n checkpoints: ∝ √n")
ax_mem.set(xlabel="depth n (blocks)", ylabel="KiB held after forward", title="storage (the ledger)")
ax_fwd.plot(depths, depths, "o-", label="store everything: n")
ax_fwd.plot(depths, recomputes, "^-", label="store nothing: n(n + 1)/2")
ax_fwd.set(xlabel="depth n (blocks)", ylabel="block forwards per step", title="compute")
for ax in (ax_mem, ax_fwd):
    ax.legend()
fig.tight_layout()
save_figure(fig, "28_storage_against_depth.png")

# %% [markdown]
# ## 4. Half the bytes, (nearly) twice the batch: what fits a fixed budget
#
# The slides' "Reduce Memory Consumption: Halve the size of activation and gradient tensors; Enables
# larger minibatches or larger input sizes". `fp8_trainer` rounds every activation at a layer boundary to
# FP8, whose values are float16 values; with `half_storage=True` (`storage.HalfStoredActivations`) each
# layer keeps what its forward saved for backward as np.float16 where that is exact, and loads it back to
# float32 just before its backward — so training is bitwise the same and only the bytes change. The
# ledger (`record`, minidist/sim/memory.py) measures the second step at its peak, "after forward": the
# model's parameters (the working copy), gradients and the optimizer's state (SGD's momentum and the
# master weights) — the *model states*, whose size does not depend on the batch — and the activations.
#
# Budget: 4 MiB. Activations are exactly linear in the batch B, held(B) = fixed + a·B, so two measured
# points give `fixed` and `a`, and the largest batch is B_max = ⌊(budget − fixed) / a⌋; then the ledger
# checks it: a step of B_max fits, one of B_max + 1 does not. Three models on 8×8 inputs (the digits'
# size): a small convnet, and 64-256-256-10 MLPs with ReLU and with GELU.

# %%
BUDGET = 4 * 2**20


class PeakAfterForward(Attachment):
    """Records the trainer's held bytes in a MemoryLedger at after_loss, the step's activation peak."""

    def __init__(self, trainer, ledger):
        self.trainer, self.ledger = trainer, ledger

    def after_loss(self, dy):
        t = self.trainer
        record(self.ledger, "after forward", t.model, t.optimizer, extra={"optimizer": t._masters})
        return dy


def convnet(init):
    return Sequential(Conv2d(1, 8, 3, padding=1, rng=init), ReLU(), MaxPool2d(2),
                      Conv2d(8, 16, 3, padding=1, rng=init), ReLU(), MaxPool2d(2), Flatten(),
                      Linear(64, 10, rng=init))


def mlp(activation):
    return lambda init: Sequential(Linear(64, 256, rng=init), activation(), Linear(256, 256, rng=init),
                                   activation(), Linear(256, 10, rng=init))


MODELS = {"convnet": (convnet, (1, 8, 8)), "ReLU MLP": (mlp(ReLU), (64,)), "GELU MLP": (mlp(GELU), (64,))}


def peak_after_forward(name: str, half: bool, batch: int) -> dict[str, int]:
    """Two fp8_trainer steps of MODELS[name] on `batch` rows; the ledger's point of the second."""
    build, shape = MODELS[name]
    model = build(np.random.default_rng(0))
    scaler = EnhancedLossScaler([(0, 2.0**8)], init_scale=2.0**8)     # low enough that no step is skipped
    trainer = fp8_trainer(model, SGD(model.parameters(), lr=0.05, momentum=0.9), CrossEntropyLoss(),
                          np.random.default_rng(1), scaler=scaler, accum_fmt=None, half_storage=half)
    ledger = MemoryLedger()
    trainer.runner.attachments.append(PeakAfterForward(trainer, ledger))
    data = np.random.default_rng(2)
    x, y = data.standard_normal((batch, *shape)).astype(np.float32), data.integers(0, 10, batch)
    for _ in range(2):                                   # the momentum exists from the first update on
        assert trainer.train_step(x, y)[1]
    return ledger.timeline[-1][2]


fits = {}
for name in MODELS:
    for half in (False, True):
        one, two = peak_after_forward(name, half, 1), peak_after_forward(name, half, 2)
        per_row = two["activations"] - one["activations"]                     # a: bytes per row
        states = {c: one[c] for c in MODEL_STATES}
        b_max = (BUDGET - sum(one.values()) + per_row) // per_row             # (budget − fixed) // a
        at_max, above = (sum(peak_after_forward(name, half, b).values()) for b in (b_max, b_max + 1))
        assert at_max <= BUDGET < above                   # the ledger itself: B_max fits, B_max + 1 does not
        fits[name, half] = (b_max, per_row, states)
        print(f"{name:8s} {'2-byte' if half else 'FP32  '} storage: {per_row:6,} B of activations per row, "
              f"model states {sum(states.values()):9,} B: the largest batch in 4 MiB is {b_max:5,}")
ratios = {}
for name in MODELS:
    (b32, a32, states32), (b16, a16, states16) = fits[name, False], fits[name, True]
    ratios[name] = b16 / b32
    print(f"{name}: activations ÷ {a32 / a16:.3f}, largest batch × {b16 / b32:.3f}")
    assert states32 == states16                      # weights, gradients, optimizer state: not halved
    assert abs(b16 / b32 - a32 / a16) < 0.01 * a32 / a16    # the batch grows as the activations shrink
assert 1.85 < ratios["convnet"] < 2 and 1.6 < ratios["ReLU MLP"] < 1.75 and 1.45 < ratios["GELU MLP"] < 1.6

# %% [markdown]
# Close to 2× where nearly everything a layer saves is a rounded float: the convnet's im2col columns and
# max-pool inputs. What halves is exactly what the recipe's rounding made float16-valued; what does not:
#
# - the **model states**: the weights, their gradients, the momentum and the masters are the same bytes
#   in both runs (float32 here whatever values they hold; the FP8 paper's FP16 masters would be 2 bytes,
#   but they are the update's storage, not the batch's). They come off the budget first, so the batch
#   grows by the activations' ratio only on what is left — the MLPs' 1.36 MB of states out of 4.19 MB.
# - **ReLU's mask**, a boolean per element: 1 byte already (a packed bit mask would be 1/8), so the ReLU
#   MLP's activations shrink by 2,816 / 1,664 ≈ 1.69, not 2.
# - **float32 results computed inside a layer**: GELU keeps Φ(x) besides x (1.52 here), LayerNorm its x̂ and
#   1/σ, attention its probabilities. They are not float16 values; storing them in 2 bytes would be one
#   more rounding, which this emulation does not do (tests/precision/test_precision_storage.py shows
#   which arrays stay 4 bytes).
