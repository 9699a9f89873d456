# %% [markdown]
# # 03 — Mixed precision: FP16, BF16 and FP8 training
#
# **Goal.** See why 16-bit (and even 8-bit) floating point can train a network, and exactly where it
# breaks: the *range* (small gradients underflow to zero, large ones overflow to Inf) and the
# *precision* (small updates vanish next to large weights). Then see the three fixes the lecture
# teaches: FP32 master weights, loss scaling (static and dynamic), and stochastic rounding — plus the
# chunk-based accumulation of the FP8 paper.
#
# Sources: Pedram & Olukotun, "Hardware Accelerators for Training Deep Neural Networks" ("Low/Mixed Precision
# Training", "Weight Update", "Loss Scaling", "Automatic Loss Scaling", "Stochastic Rounding", "8-Bit
# Floating-Point Training": Micikevicius et al.; Wang et al. 2018; Mellempudi et al. 2019) and
# the slides "Scaling Up Training" ("Mixed-Precision Training: Loss Scaling").
#
# Everything below runs minidist's emulation: `quantize(x, fmt)` rounds float32/float64 arrays to the
# values of a format, exactly (round-to-nearest-even, or stochastic rounding), so float32 NumPy code
# behaves as if it computed in FP16 or FP8 at every place we round.

# %%

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from minidist.data import iterate_batches, load_digits
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD
from minidist.plots import figures_dir, save_figure
from minidist.precision import (
    BF16,
    FP8_E4M3,
    FP8_E5M2,
    FP16,
    FP32,
    DynamicLossScaler,
    MixedPrecisionTrainer,
    encode,
    lowp_dot,
    quantize,
)

FIGURES = figures_dir()  # figures/, or $MINIDIST_FIGURES (the tests use a temporary folder)
FORMATS = [FP32, FP16, BF16, FP8_E5M2, FP8_E4M3]

# %% [markdown]
# ## 1. The formats side by side
#
# A format (s, e, m) stores a sign, e exponent bits and m fraction bits. Normal numbers are
# 1.fraction · 2^(exponent − bias); with the exponent field at 0 they become *subnormal*
# (0.fraction · 2^(1 − bias)), which extends the range downwards at reduced precision.
# Range is set by e, precision by m: epsilon = 2^−m is the gap between 1 and the next value.
#
# The tutorial's table gives FP16's maximum as 65,535. **That is wrong**: the largest FP16 value is
# (2 − 2^−10) · 2^15 = **65,504**, and 65,535 is not even representable — it rounds to Inf.

# %%
print(f"{'format':10s} {'(s,e,m)':>8s} {'max normal':>11s} {'min normal':>11s} {'min subnormal':>14s} "
      f"{'epsilon':>9s} {'digits':>6s}")
for fmt in FORMATS:
    print(f"{fmt.name:10s} {f'1,{fmt.exp_bits},{fmt.man_bits}':>8s} {fmt.max_normal:11.4g} "
          f"{fmt.min_normal:11.4g} {fmt.min_subnormal:14.4g} {fmt.epsilon:9.3g} "
          f"{np.log10(2.0) * (fmt.man_bits + 1):6.1f}")

assert FP16.max_normal == 65504.0
assert quantize(np.array([65535.0]), FP16)[0] == np.inf        # the slide's "max" overflows
assert quantize(np.array([65519.0]), FP16)[0] == 65504.0       # below the midpoint 65520: rounds down
assert encode(np.array([65504.0]), FP16)[0] == 0x7BFF         # 0 11110 1111111111
assert (FP8_E5M2.max_normal, FP8_E5M2.min_subnormal) == (57344.0, 2.0**-16)   # tutorial: 57 344, 1.52e-5
assert (FP8_E4M3.max_normal, FP8_E4M3.min_subnormal) == (448.0, 2.0**-9)
print("FP16 max is 65,504 (0x7BFF); 65,535 rounds to", quantize(np.array([65535.0]), FP16)[0])

# %%
fig, ax = plt.subplots(figsize=(9, 3.2))
for row, fmt in enumerate(FORMATS[1:]):
    lo_sub, lo, hi = np.log2(fmt.min_subnormal), np.log2(fmt.min_normal), np.log2(fmt.max_normal)
    ax.barh(row, lo - lo_sub, left=lo_sub, color="tab:blue", alpha=0.35)
    ax.barh(row, hi - lo, left=lo, color="tab:blue")
    ax.text(hi + 1, row, f"{hi - lo_sub:.0f} powers of 2", va="center", fontsize=8)
ax.set_yticks(range(4), [f.name for f in FORMATS[1:]])
ax.set_xlabel("log2 |x|   (light: subnormal range, dark: normal range)")
ax.set_xlim(-140, 150)
ax.invert_yaxis()
ax.set_title("Range of the 16- and 8-bit formats")
fig.tight_layout()
save_figure(fig, "03_formats.png", dpi=110)
plt.close(fig)
assert round(np.log2(FP16.max_normal) - np.log2(FP16.min_subnormal)) == 40   # tutorial: "~40 powers of 2"

# %% [markdown]
# ## 2. Swamping: precision, not range
#
# The tutorial: "Sum of FP16 values whose ratio is greater than 2^11 is just the larger value" — with
# 10 fraction bits, aligning the binary points shifts the small value out. Two consequences:
#
# * a running sum in FP16 stops growing: adding 0.01 again and again gets stuck at 32, where half an
#   ulp (2^−6) exceeds 0.01;
# * a weight update w − lr·dW is lost when w ≫ lr·dW — the reason for keeping **FP32 master weights**.
#
# Stochastic rounding (tutorial: "Round(x) = ⌊x⌋ + ε with probability (x − ⌊x⌋)/ε") rounds up with
# probability equal to the fraction, so the *expected* result is exact and small additions survive on
# average.

# %%
step = quantize(np.array(0.01), FP16)
rng = np.random.default_rng(0)
nearest, stochastic = np.zeros(1), np.zeros(1)
for _ in range(10_000):
    nearest = quantize(nearest + step, FP16)
    stochastic = quantize(stochastic + step, FP16, rounding="stochastic", rng=rng)
print(f"10,000 × 0.01 in FP16: nearest-even {nearest[0]:.2f}, stochastic {stochastic[0]:.2f}, "
      f"exact {10_000 * float(step):.2f}")
assert nearest[0] == 32.0 and abs(stochastic[0] - 100) < 2

w, update = np.float32(1.0), np.float32(1e-4)          # lr·dW / w = 1e-4 < 2^-11
print(f"FP16: 1 − 1e-4 = {quantize(np.array(w - update), FP16)}  (the update is lost; in FP32 it is kept: "
      f"{w - update!r})")
assert quantize(np.array(w - update), FP16) == 1.0 and w - update != 1.0
assert quantize(np.array(1.0 + 2.0**-10), FP16) != 1.0  # ratio 2^10: still visible

# %% [markdown]
# ## 3. Where gradients live, and loss scaling
#
# We train a small MLP on the 8×8 digits in FP32 and record every weight gradient and every gradient
# flowing between layers. The tutorial's observation: "gradients are small, don't use much of FP16 range".
# Whatever lies below FP16's smallest subnormal (2^−24) becomes 0 — and in FP8 E5M2 everything below
# 2^−16. **Loss scaling** multiplies the loss by s before backward, so (chain rule) every gradient is
# s times larger and moves up into the representable range; the weight gradients are divided by s in
# FP32 before the update.

# %%
digits = load_digits()


def make_mlp(seed: int = 0) -> Sequential:
    init = np.random.default_rng(seed)
    return Sequential(Linear(64, 64, rng=init), ReLU(), Linear(64, 10, rng=init))


def accuracy(forward) -> float:
    return float(np.mean(forward(digits.x_test).argmax(axis=1) == digits.y_test))


model, loss_fn = make_mlp(), CrossEntropyLoss()
optimizer = SGD(model.parameters(), lr=0.05, momentum=0.9)
batches = np.random.default_rng(1)
recorded = []
for _epoch in range(6):
    for index in iterate_batches(len(digits.y_train), 32, batches):
        optimizer.zero_grad()
        loss_fn.forward(model.forward(digits.x_train[index]), digits.y_train[index])
        dy = loss_fn.backward()
        recorded.append(dy.ravel())
        for layer in reversed(model.layers):
            dy = layer.backward(dy)
            recorded.append(dy.ravel())
        recorded.extend(p.grad.ravel().copy() for p in model.parameters())
        optimizer.step()
gradients = np.concatenate(recorded)
gradients = gradients[gradients != 0]

scale = 2.0**10
lost = {}
for name, fmt in (("FP16", FP16), ("E5M2", FP8_E5M2)):
    for s in (1.0, scale):
        lost[name, s] = float(np.mean(quantize(gradients * s, fmt) == 0))
        print(f"{name}, loss scale {s:6.0f}: {100 * lost[name, s]:5.1f}% of the non-zero gradients become 0")
assert lost["E5M2", 1.0] > 0.05 and lost["E5M2", scale] < lost["E5M2", 1.0] / 5
assert lost["FP16", scale] <= lost["FP16", 1.0]
assert np.abs(gradients).max() * scale < FP8_E5M2.max_normal      # the scale does not overflow

fig, ax = plt.subplots(figsize=(9, 3.6))
bins = np.arange(-40, 6, 0.5)
ax.hist(np.log2(np.abs(gradients)), bins=bins, color="gray", alpha=0.7, label="gradients (FP32 run)")
ax.hist(np.log2(np.abs(gradients * scale)), bins=bins, color="tab:green", alpha=0.45,
        label=f"× loss scale 2^{int(np.log2(scale))}")
for fmt, colour in ((FP16, "tab:blue"), (FP8_E5M2, "tab:red")):
    ax.axvline(np.log2(fmt.min_subnormal), color=colour, ls="--", label=f"{fmt.name} min subnormal")
    ax.axvline(np.log2(fmt.min_normal), color=colour, ls=":", label=f"{fmt.name} min normal")
ax.set_xlabel("log2 |gradient|")
ax.set_ylabel("count")
ax.set_title("Gradients of the digits MLP: left of a dashed line they round to 0")
ax.legend(fontsize=7, loc="upper left")
fig.tight_layout()
save_figure(fig, "03_gradients.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ## 4. Dynamic loss scaling over a run
#
# Choosing s by hand is fiddly: too small keeps too few small values, too large overflows. The tutorial's
# "automatic loss scaling" (torch.amp.GradScaler's rule, which `DynamicLossScaler` follows exactly):
# start large; if the gradients hold Inf/NaN, halve s and **skip** the step; after N clean steps
# (`growth_interval`, 2000 by default) double s. We start at 2^24 with N = 40 so that a short run shows
# both the back-offs and the growth.

# %%
model = make_mlp()
scaler = DynamicLossScaler(init_scale=2.0**24, growth_interval=40)
trainer = MixedPrecisionTrainer(model, SGD(model.parameters(), lr=0.05, momentum=0.9), CrossEntropyLoss(),
                                FP16, scaler=scaler)
scales, skipped = [], []
batches = np.random.default_rng(1)
for _epoch in range(6):
    for index in iterate_batches(len(digits.y_train), 32, batches):
        scales.append(scaler.scale)
        _, applied = trainer.train_step(digits.x_train[index], digits.y_train[index])
        skipped.append(not applied)
scales, skipped = np.array(scales), np.array(skipped)
print(f"{len(scales)} steps, {skipped.sum()} skipped; scale went from 2^{np.log2(scales[0]):.0f} to "
      f"2^{np.log2(scaler.scale):.0f}; test accuracy {accuracy(trainer.forward):.3f}")
assert skipped[:3].all() and skipped.sum() < 0.1 * len(skipped)
assert (np.diff(np.log2(scales))[~skipped[:-1]] >= 0).all()      # scale only drops after an overflow
assert (np.diff(np.log2(scales)) > 0).any()                     # and it grows after 40 clean steps

fig, ax = plt.subplots(figsize=(9, 3.2))
ax.step(np.arange(len(scales)), np.log2(scales), where="post", label="log2 loss scale")
ax.plot(np.flatnonzero(skipped), np.log2(scales[skipped]), "rx", label="skipped step (Inf/NaN)")
ax.set_xlabel("step")
ax.set_ylabel("log2 scale")
ax.set_title("Dynamic loss scaling, FP16 mixed precision on the digits (growth_interval = 40)")
ax.legend()
fig.tight_layout()
save_figure(fig, "03_loss_scale.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ## 5. Training the digits MLP: FP32, FP16 mixed, FP8 with nearest vs stochastic rounding
#
# * **FP32**: the reference.
# * **FP16 mixed**: FP16 weights, activations and gradients in forward and backward; FP32 masters;
#   dynamic loss scaling. The tutorial's table: mixed precision matches FP32 accuracy.
# * **FP8 (E5M2)**: weights, activations and gradients in FP8. Here we go further than the FP8 papers
#   (which keep 16-bit masters) and *store the weights themselves in FP8*, updating them with
#   round-to-nearest or with stochastic rounding. With 2 fraction bits, an update lr·dW below half an
#   ulp of w (w/8 or so) is always rounded away: training stalls. Stochastic rounding keeps every update
#   in expectation, which is what the FP8 papers use it for.

# %%
configs = {
    "FP32": None,
    "FP16 mixed": {"fmt": FP16},
    "FP8, weights FP8, nearest": {"fmt": FP8_E5M2, "master_fmt": FP8_E5M2, "update_rounding": "nearest"},
    "FP8, weights FP8, stochastic": {"fmt": FP8_E5M2, "master_fmt": FP8_E5M2,
                                     "update_rounding": "stochastic"},
}
history = {}
for name, config in configs.items():
    model, loss_fn = make_mlp(), CrossEntropyLoss()
    optimizer = SGD(model.parameters(), lr=0.05)
    trainer = None if config is None else MixedPrecisionTrainer(
        model, optimizer, loss_fn, rng=np.random.default_rng(3),
        scaler=DynamicLossScaler(growth_interval=100), **config)
    forward = model.forward if trainer is None else trainer.forward
    batches = np.random.default_rng(1)
    losses, accuracies = [], []
    for _epoch in range(12):
        epoch_loss = []
        for index in iterate_batches(len(digits.y_train), 32, batches):
            x, y = digits.x_train[index], digits.y_train[index]
            if trainer is None:
                optimizer.zero_grad()
                epoch_loss.append(loss_fn.forward(model.forward(x), y))
                model.backward(loss_fn.backward())
                optimizer.step()
            else:
                epoch_loss.append(trainer.train_step(x, y)[0])
        losses.append(np.mean(epoch_loss))
        accuracies.append(accuracy(forward))
    history[name] = (losses, accuracies)
    print(f"{name:30s} final loss {losses[-1]:.3f}, test accuracy {accuracies[-1]:.3f}")

final = {name: acc[-1] for name, (_, acc) in history.items()}
assert abs(final["FP16 mixed"] - final["FP32"]) <= 0.01             # within 1 point of FP32
assert final["FP8, weights FP8, stochastic"] > final["FP8, weights FP8, nearest"] + 0.3
assert final["FP8, weights FP8, stochastic"] > 0.8

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
styles = {"FP32": {"lw": 4, "alpha": 0.5}, "FP16 mixed": {"ls": "--"}}   # FP16 lies on top of FP32
for name, (losses, accuracies) in history.items():
    epochs = np.arange(1, len(losses) + 1)
    left.plot(epochs, losses, marker=".", label=name, **styles.get(name, {}))
    right.plot(epochs, accuracies, marker=".", label=name, **styles.get(name, {}))
left.set(xlabel="epoch", ylabel="training loss", title="Loss", yscale="log")
right.set(xlabel="epoch", ylabel="test accuracy", title="Accuracy", ylim=(0, 1))
right.legend(fontsize=8, loc="lower right")
fig.tight_layout()
save_figure(fig, "03_training.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ## 6. Chunk-based accumulation (Wang et al. 2018)
#
# An FP8 GEMM multiplies in 8 bits and adds in 16. A long dot product accumulated sequentially in FP16
# swamps as in section 2: once the sum is large, each product is below half its ulp. Chunking sums CL
# products at a time (CL = 64 in the tutorial's figure) into a small partial sum, then adds the K/CL partials:
# far fewer small-into-large additions. Stochastic rounding of the accumulator is the other fix:
# the rounding errors average out instead of all pointing down. `lowp_dot` rounds after *every* addition,
# exactly as the hardware would.

# %%
rng = np.random.default_rng(4)
lengths = [64, 256, 1024, 4096]
errors = {"sequential": [], "chunked, CL = 64": [], "sequential, stochastic": []}
trials = 16
for k in lengths:
    x = rng.uniform(0, 1, (trials, k))
    y = rng.uniform(0, 1, (trials, k))
    xq, yq = quantize(x, FP8_E5M2), quantize(y, FP8_E5M2)
    exact = np.einsum("tk,tk->t", xq, yq)              # float64: exact for these products
    runs = {"sequential": {}, "chunked, CL = 64": {"chunk": 64},
            "sequential, stochastic": {"rounding": "stochastic", "rng": rng}}
    for name, options in runs.items():
        got = lowp_dot(x, y, FP8_E5M2, FP16, **options)
        errors[name].append(float(np.mean(np.abs(got - exact) / exact)))
for name, errs in errors.items():
    print(f"{name:24s} " + "  ".join(f"K={k}: {e:.1e}" for k, e in zip(lengths, errs)))
assert errors["sequential"][-1] > 10 * errors["chunked, CL = 64"][-1]
assert errors["sequential"][-1] > 5 * errors["sequential, stochastic"][-1]
assert errors["sequential"][-1] > errors["sequential"][0]

fig, ax = plt.subplots(figsize=(6.5, 3.8))
for name, errs in errors.items():
    ax.loglog(lengths, errs, marker="o", label=name)
ax.set_xlabel("dot-product length K")
ax.set_ylabel("mean relative error")
ax.set_title("FP8 (E5M2) products, FP16 accumulator")
ax.legend()
fig.tight_layout()
save_figure(fig, "03_chunking.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ## What to remember
#
# * FP16 spans ~40 powers of 2 (max **65,504**), with 11 significant bits; BF16 keeps FP32's range with
#   8 bits; FP8 E5M2 keeps FP16's range with 3 bits, E4M3 trades range (max 448) for a 4th bit.
# * Range problems (underflow of small gradients) are fixed by **loss scaling**; dynamic scaling finds
#   the scale by itself and skips the few steps that overflow.
# * Precision problems (swamping) are fixed by **FP32 master weights**, **chunked accumulation** and
#   **stochastic rounding**, whose expected value is exact.

# %% [markdown]
# ## Exercises
#
# * `stochastic_rounding` — round to one of the two representable neighbours with probability
#   proportional to closeness, so E[round(x)] = x exactly (subnormals included), drawing from the given
#   `rng` (a `numpy.random.Generator`). Check: `python -m pytest --exercise stochastic_rounding`.
# * `dynamic_loss_scaling` — `DynamicLossScaler.update(found_inf)`: multiply `self.scale` by
#   `backoff_factor` on Inf/NaN and reset `self.clean_steps`; after `growth_interval` clean steps grow by
#   `growth_factor` (never into Inf); respect `min_scale`.
#   Check: `python -m pytest --exercise dynamic_loss_scaling`.
#
# Hint: section 4 runs the scaler over a whole run and asserts where it backs off and grows.
