# %% [markdown]
# # 21 — Inside the accelerator: systolic arrays, tensor cores, rooflines, persistent RNNs, int8
#
# **Goal.** The earlier lessons treat an accelerator as "peak FLOP/s and a memory bandwidth". This one
# opens it, with the numbers of the "Hardware Accelerators for Training DNNs" tutorial and Catanzaro's
# "Scaling Deep Learning" slides:
#
# 1. TPU v1's Matrix Unit, "65,536 (256x256) 8-bit multiply-accumulate units, systolic array, 700 MHz,
#    peak 92T operations/second = 65,536 · 2 · 700M": a weight-stationary systolic array, cycle by cycle;
# 2. a Volta tensor core: a 4 × 4 × 4 multiply-accumulate with FP16 inputs and FP32 accumulation;
# 3. the devices of the slides (TPU v1, GP100, V100, TPU v2/v3) as rooflines, the course's layers on them,
#    and the batch at which a Linear layer stops being memory-bound;
# 4. persistent RNNs — "make a bandwidth bound problem a compute bound problem": 1152 hidden units in the
#    6 MB register file of a Maxwell Titan X, with nn.RNN / nn.LSTM and their BPTT;
# 5. "lower precision integer for inference: Int8" on the digits;
# 6. a GPU's training step op by op on its achieved roofs: why it takes longer than its FLOPs at peak.

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from threadpoolctl import threadpool_limits  # comes with scikit-learn

from minidist.cluster import run
from minidist.collectives.pieces import split_range
from minidist.data import load_digits
from minidist.hardware import systolic
from minidist.hardware.devices import (
    DEVICES,
    TITAN_X_REGISTERS,
    largest_persistent_rnn,
    linear_crossing_batch,
    rnn_step_cost,
)
from minidist.hardware.roofline import layer_cost
from minidist.hardware.tensor_core import mma, tensor_core_matmul
from minidist.nn import LSTM, RNN, Conv2d, Linear
from minidist.parallel.rnn import PersistentRNN
from minidist.precision import FP16, FP32
from minidist.precision.int8 import Int8Layer, quantize_model, weight_bytes
from minidist.recipes.demo import train_digits_mlp
from minidist.sim.plots import save_figure

threadpool_limits(limits=1, user_api="blas")   # small matrices: one BLAS thread is faster

# %% [markdown]
# ## 1. The systolic array
#
# PE (i, j) of a k × k array keeps the weight W[i, j]. Each cycle it takes an activation from the left
# and a partial sum from above, passes the activation right and `partial + activation · weight` down.
# Row r of A enters array row i at cycle r + i (skewed), so output C[r, j] leaves the bottom of column j
# at cycle r + (k − 1) + j. One tile of n rows takes **fill (k − 1) + stream n + drain (k − 1)** cycles.

# %%
tpu_v1 = DEVICES["TPU v1 (int8)"]
assert tpu_v1.peak == 256 * 256 * 2 * 700e6 and round(tpu_v1.peak / 1e12) == 92       # the slide's 92T
print(f"TPU v1 peak: 65,536 MACs · 2 · 700 MHz = {tpu_v1.peak / 1e12:.2f} T int8 ops/s")

rng = np.random.default_rng(0)
k, n = 4, 6
a = rng.integers(-128, 128, (n, k))                 # int8 values, int64 accumulator: exact
w = rng.integers(-128, 128, (k, k))
frames: list = []
c_tile, tile_cycles, busy = systolic.run_tile(a, w, frames=frames)
assert np.array_equal(c_tile, a @ w) and tile_cycles == (k - 1) + n + (k - 1) == len(frames)
print(f"{k}x{k} array, {n} rows: {tile_cycles} cycles = fill {k - 1} + stream {n} + drain {k - 1}, "
      f"utilisation {busy / (k * k * tile_cycles):.0%}")

fig, axes = plt.subplots(2, 6, figsize=(11, 4.8))
for c, ax in enumerate(axes.flat[:tile_cycles]):
    shown = np.ma.masked_less(frames[c], 0)
    ax.imshow(shown, cmap="viridis", vmin=0, vmax=n - 1)
    for (i, j), r in np.ndenumerate(frames[c]):
        ax.text(j, i, "" if r < 0 else str(r), ha="center", va="center",
                color="w" if r < n / 2 else "k", fontsize=9)
    ax.set(title=f"cycle {c}", xticks=[], yticks=[])
for ax in axes.flat[tile_cycles:]:
    ax.axis("off")
fig.suptitle(f"weight-stationary {k}x{k} array: which row of A each PE works on (blank: idle); "
             "activations move right, partial sums down")
fig.tight_layout()
save_figure(fig, "21_systolic_frames.png", dpi=90)
plt.close(fig)

# %% [markdown]
# A larger product runs tile after tile (`tile_schedule`, the exercise), adding into the accumulator.
# The array is busy only when many rows stream through one tile and the matrix fills whole tiles:

# %%
a = rng.integers(-128, 128, (10, 7))
w = rng.integers(-128, 128, (7, 9))
c_full, total, busy = systolic.systolic_matmul(a, w, k=4)
assert np.array_equal(c_full, a @ w) and total == systolic.cycles(10, 7, 9, 4) == 2 * 3 * (10 + 6)
assert busy == 10 * 7 * 9
batches = 2 ** np.arange(0, 17)
shapes = {"256 x 256 weights": (256, 256), "257 x 256 (one row too many)": (257, 256),
          "64 x 64 (small layer)": (64, 64)}
fig, ax = plt.subplots(figsize=(6.5, 3.8), constrained_layout=True)
for label, (kk, mm) in shapes.items():
    ax.semilogx(batches, [systolic.utilisation(int(b), kk, mm, 256) for b in batches], "o-", ms=3,
                label=label)
ax.set(xlabel="rows streamed per tile (batch)", ylabel="utilisation of a 256x256 array", ylim=(0, 1),
       title="fill + drain cost 2(k−1) cycles per tile; ragged shapes waste PEs")
ax.legend()
save_figure(fig, "21_systolic_utilisation.png", dpi=90)
plt.close(fig)
u = {label: systolic.utilisation(65536, kk, mm, 256) for label, (kk, mm) in shapes.items()}
print("utilisation at batch 65,536:", {key: f"{v:.1%}" for key, v in u.items()})
assert systolic.utilisation(256, 256, 256, 256) < 0.34 and u["256 x 256 weights"] > 0.99
assert u["257 x 256 (one row too many)"] < 0.51 and u["64 x 64 (small layer)"] < 0.07

# %% [markdown]
# ## 2. A tensor-core tile
#
# Volta: 640 tensor cores, each one D = A·B + C on 4 × 4 matrices per clock (64 FMAs), A and B in FP16,
# C and D in FP32. An FP16 product has at most 22 significant bits, exact in FP32; so FP32 accumulation
# only rounds the sums, while an FP16 accumulator rounds every partial sum to 11 bits.

# %%
a4, b4, c4 = rng.standard_normal((3, 4, 4))
d4 = mma(a4, b4, c4)
assert d4.shape == (4, 4) and np.array_equal(d4, d4.astype(np.float32))
errors = {}
for K in (16, 256, 4096):
    x, y = rng.uniform(0, 1, (4, K)), rng.uniform(0, 1, (K, 4))
    exact = x.astype(np.float16).astype(np.float64) @ y.astype(np.float16).astype(np.float64)
    errors[K] = [float(np.abs(tensor_core_matmul(x, y, accum=f) - exact).max() / exact.max())
                 for f in (FP32, FP16)]
    print(f"K = {K:5d}: relative error with FP32 accumulation {errors[K][0]:.1e}, FP16 {errors[K][1]:.1e}")
assert all(e32 < 1e-5 and e16 > 1000 * e32 for e32, e16 in errors.values())
assert errors[4096][1] > 10 * errors[16][1]                # the FP16 accumulator's error grows with K

# %% [markdown]
# ## 3. The slides' devices as rooflines
#
# Ridge point = peak / bandwidth: a kernel needs that many FLOPs per byte to be compute-bound. GP100:
# "10 TeraFLOPS FP32, 67 GFLOPS/W (FP16), 300 W" — 67 · 300 = 20.1 TFLOPS, twice FP32. V100's clock
# (1530 MHz) and TPU v3's numbers are not on the slides (datasheet, Google's TPU v3 page).

# %%
for name, m in DEVICES.items():
    print(f"{name:24s} peak {m.peak / 1e12:7.2f} T/s   memory {m.memory_bw / 1e9:6.1f} GB/s   "
          f"ridge {m.ridge:7.1f} FLOP/B")
assert abs(DEVICES["GP100 (FP16)"].peak / DEVICES["GP100 (FP32)"].peak - 2) < 0.01
assert round(DEVICES["V100 (tensor cores)"].peak / 1e12) == 125 and DEVICES["TPU v2"].ridge == 75
# TPU v1's ridge is huge: the paper's "1350 ops per weight byte" counts a MAC as one op; we count two
assert round(tpu_v1.ridge) == 2688

# The course's layers (forward, FP32), placed on the V100's roofline.
r = np.random.default_rng(1)
layers = {"digits MLP Linear 64→64, B=32": layer_cost(Linear(64, 64, rng=r), (32, 64)),
          "digits CNN Conv 8→16 on 4x4, B=32": layer_cost(Conv2d(8, 16, 3, padding=1, rng=r), (32, 8, 4, 4)),
          "Linear 4096→4096, B=1": layer_cost(Linear(4096, 4096, rng=r), (1, 4096)),
          "Linear 4096→4096, B=512": layer_cost(Linear(4096, 4096, rng=r), (512, 4096))}
v100 = DEVICES["V100 (FP32)"]
points = {name: c.forward_intensity for name, c in layers.items()}
for label, persistent in (("RNN step H=1152, N=4, W reloaded", False),
                          ("same, W on chip (persistent)", True)):
    f, b = rnn_step_cost(1152, 4, persistent)
    points[label] = f / b
for name, i in points.items():
    print(f"{name:36s} I = {i:8.2f} FLOP/B  {v100.bound(1, 1 / i)}-bound on the V100 (FP32)")

fig, ax = plt.subplots(figsize=(11, 5.2), constrained_layout=True)
xs = np.logspace(-1, 4, 300)
for name, m in DEVICES.items():
    ax.loglog(xs, [m.attainable(x) for x in xs], lw=1.2, label=name)
for (name, i), marker in zip(points.items(), "os^vDP"):
    ax.loglog(i, v100.attainable(i), marker, color="k", ms=7, mfc="none", label=name)
ax.set(xlabel="arithmetic intensity (FLOPs per byte of memory traffic)", ylabel="attainable FLOP/s",
       title="the slides' devices; the course's layers on the V100 (FP32) roof")
ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1), title="devices; layers on V100 (FP32)",
          title_fontsize=9)
save_figure(fig, "21_rooflines.png", dpi=90)
plt.close(fig)

# %% [markdown]
# A Linear layer's intensity 2·B·i·o / (s·(B·i + i·o + o + B·o)) grows with the batch B until it
# passes the ridge: the batch where it crosses, from the closed form and from the layer's own counts.

# %%
for name, itemsize in (("V100 (FP32)", 4), ("V100 (tensor cores)", 2), ("TPU v1 (int8)", 1)):
    m, b_star = DEVICES[name], linear_crossing_batch(DEVICES[name], 4096, 4096, itemsize)
    at, below = (layer_cost(Linear(4096, 4096, rng=r), (b, 4096), itemsize) for b in (b_star, b_star - 1))
    assert at.forward_intensity >= m.ridge > below.forward_intensity
    print(f"{name:20s} ({itemsize} B/element): Linear 4096→4096 becomes compute-bound at batch {b_star}")
assert linear_crossing_batch(v100, 4096, 4096, 4) == 36
assert linear_crossing_batch(DEVICES["V100 (tensor cores)"], 4096, 4096, 2) == 150

# %% [markdown]
# ## 4. Persistent RNNs
#
# "Traditional RNN implementations reload weights every timestep. This dramatically lowers the
# arithmetic intensity." One step of N sequences is 2·N·H² FLOPs; reading W_hh (H² · 4 B) each time
# makes the intensity ≈ N/2. Keeping W in the register file ("up to 6 MB on Maxwell Titan X: 24 SMs ·
# 64 K registers · 4 B) leaves only h to move: intensity H/4 for any N. "1152 neurons in 6 MB":

# %%
titan = DEVICES["Titan X (Maxwell, FP32)"]
w_bytes = 1152**2 * 4
print(f"1152² · 4 B = {w_bytes / 2**20:.2f} MiB of {TITAN_X_REGISTERS / 2**20:.0f} MiB registers "
      f"({w_bytes / TITAN_X_REGISTERS:.0%}); the largest H that fits at all: "
      f"{largest_persistent_rnn(TITAN_X_REGISTERS)}")
assert w_bytes <= TITAN_X_REGISTERS and largest_persistent_rnn(TITAN_X_REGISTERS) == 1254
for batch in (1, 4, 64):
    reload, kept = rnn_step_cost(1152, batch, False), rnn_step_cost(1152, batch, True)
    print(f"N = {batch:3d}: reload W → I = {reload[0] / reload[1]:6.1f} ({titan.bound(*reload)}-bound), "
          f"persistent → I = {kept[0] / kept[1]:6.1f} ({titan.bound(*kept)}-bound); ridge {titan.ridge:.1f}")
    assert titan.bound(*kept) == "compute"
assert titan.bound(*rnn_step_cost(1152, 4, False)) == "memory"

# %% [markdown]
# The layers themselves: `nn.RNN`, `nn.LSTM` and `nn.GRU` (torch's names, gate orders and num_layers),
# forward step by step and backpropagation through time written out (tests/nn/test_nn_rnn.py checks them
# against PyTorch autograd and finite differences). The loop over t is the sequential part no batch removes.

# %%
x_seq = rng.standard_normal((12, 4, 8)).astype(np.float32)     # T = 12 steps, N = 4, 8 features
for layer in (RNN(8, 16, rng=r), LSTM(8, 16, rng=r)):
    out, final = layer.forward(x_seq)                 # as torch: (every step's h, the final state)
    dx = layer.backward(np.ones_like(out))
    print(f"{layer!r}: output {out.shape}, dx {dx.shape}, weight_hh_l0 {layer.weight_hh_l0.shape}, "
          f"forward {layer.flops(x_seq.shape):,} FLOPs; W_hh read {x_seq.shape[0]} times")
    assert out.shape == (12, 4, 16) and dx.shape == x_seq.shape and np.array_equal(out[-1], layer.h_n[0])

# %% [markdown]
# **Distributed persistent RNNs.** "To overcome capacity limitations, distribute the model! This requires a
# global barrier between processors." `minidist.parallel.rnn.PersistentRNN` keeps rank p's hidden units'
# rows of W_ih and W_hh for good; each step computes its slice of h_t and allgathers h_t (the barrier);
# backward sends each rank's share of dh_(t−1) with one all-to-all per step. On 3 simulated accelerators:

# %%
def persistent_rank(comm, x, dy):
    layer = PersistentRNN(comm, RNN(8, 10, rng=np.random.default_rng(5), dtype=np.float64))
    y, _ = layer.forward(x)
    forward_bytes = comm.stats.bytes_sent
    dx = layer.backward(dy)
    return y, dx, forward_bytes, layer.weight_hh_l0.grad


x64, dy64 = rng.standard_normal((12, 4, 8)), rng.standard_normal((12, 4, 10))
one = RNN(8, 10, rng=np.random.default_rng(5), dtype=np.float64)
y_one, _ = one.forward(x64)
dx_one = one.backward(dy64)
results = run(persistent_rank, 3, x64, dy64)
for rank, (y, dx, sent, grad) in enumerate(results):
    lo, hi = split_range(10, 3, rank)
    assert np.allclose(y, y_one, rtol=1e-13, atol=0) and np.allclose(dx, dx_one, rtol=1e-12, atol=1e-14)
    assert np.allclose(grad, one.weight_hh_l0.grad[lo:hi], rtol=1e-12, atol=1e-14)
    assert sent == 12 * 4 * 2 * (hi - lo) * 8       # the allgather sends its own units to the 2 others
print(f"3 ranks, H = 10 split {[split_range(10, 3, p) for p in range(3)]}: output, dx and every rank's "
      f"dW_hh rows equal one process; forward bytes sent per rank {[r[2] for r in results]} "
      f"(12 steps × 4 sequences × its own units to 2 others × 8 B)")

# %% [markdown]
# ## 5. int8 inference
#
# Per output channel, s_W = max|W[c]| / 127; per tensor, s_x = max|x| / 127 from a calibration batch.
# The layer multiplies int8 by int8 into an integer accumulator and rescales by s_x · s_W[c].

# %%
digits = load_digits()
mlp = train_digits_mlp(epochs=10).model
q_mlp = quantize_model(mlp, digits.x_train[:256])
acc_fp32 = float((mlp.forward(digits.x_test).argmax(1) == digits.y_test).mean())
acc_int8 = float((q_mlp.forward(digits.x_test).argmax(1) == digits.y_test).mean())
stored, as_fp32 = weight_bytes(q_mlp)
int8_values = sum(layer.weight_q.nbytes for layer in q_mlp if isinstance(layer, Int8Layer))
print(f"digits MLP: FP32 {acc_fp32:.1%}, int8 {acc_int8:.1%}; weights {as_fp32:,} B → {int8_values:,} B "
      f"(+ {stored - int8_values} B of scales): {as_fp32 / stored:.2f}x smaller")
assert abs(acc_int8 - acc_fp32) <= 0.01 and 4 * int8_values == as_fp32 and as_fp32 / stored > 3.7

# %% [markdown]
# ## 6. A GPU step, op by op
#
# The planner (`python -m minidist plan ... --explain`) prices each kernel of a training step on the
# roofs a GPU *achieves*: a BF16 8192³ matmul ran at 791 of the H100's 989 TFLOP/s and a copy at 3.00 of
# its 3.35 TB/s (measured for minidist's issue 44). A step is slower than its FLOPs at peak for four
# reasons the table shows. Matmuls with a short K (d = 768) store their outputs after short loops and
# fill the SMs in whole waves of tiles (NVIDIA's "Matrix Multiplication Background User's Guide"): 450–820
# TFLOP/s. Attention runs at FlashAttention-2's published 180–230 TFLOP/s at T = 1024. LayerNorm, GELU,
# residual adds, cross-entropy over 50,304 logits a token and AdamW do almost no arithmetic: they are
# bound by bytes, and eager PyTorch moves more of them than torch.compile, which fuses passes.

# %%
from minidist.plan import Layout, ModelSpec, hardware  # noqa: E402
from minidist.plan.explain import format_explain, format_memory  # noqa: E402
from minidist.plan.memory import predict_memory  # noqa: E402
from minidist.plan.predict import step_compute, step_ops  # noqa: E402

gpt2 = ModelSpec(layers=12, d_model=768, heads=12, seq=1024, batch=16, vocab=50304)
one_step = Layout(micro_batch=16)
measured_run = hardware("h100", 1, 1, weights="autocast")   # the measured run: FP32 parameters, autocast
print(format_explain(gpt2, one_step, measured_run))
fused, eager = (step_compute(gpt2, one_step, hardware("h100", 1, 1, fused=f, weights="autocast"))["total"]
                for f in (True, False))
ops = step_ops(gpt2, one_step, measured_run)
flops = 12 * sum(op.flops for op in ops["layer"]) + sum(op.flops for op in ops["head"])
measured = {"torch.compile": 42.19e-3, "eager": 51.22e-3}   # one H100 80GB, PyTorch 2.11 (planner_gpu.md)
print(f"predicted {fused * 1e3:.1f} ms fused, {eager * 1e3:.1f} ms eager; measured 42.19 and 51.22 ms")
assert fused > 2.5 * flops / 989e12 and abs(fused / measured["torch.compile"] - 1) < 0.15
assert abs(eager / measured["eager"] - 1) < 0.2
assert {op.roof for op in ops["layer"] if op.flops and "attention" not in op.name} == {"compute"}
assert all(op.roof == "memory" for op in ops["layer"] if op.flops == 0)

# %% [markdown]
# The same step's memory, at its peak moment (`minidist/plan/memory.py`): the allocator's high-water mark is
# the largest moment of the step, here the loss of the last micro-batch, when every layer's activations,
# the weights' 16-bit copies and the loss's tensors at the vocabulary's size (16-bit logits, cross-entropy's
# FP32 copy and its log-probabilities: 10 bytes a logit) are all alive; the optimizer's moment holds only
# the 16 bytes a parameter. FlashAttention never writes the T × T scores: eager attention would keep
# Korthikanti's 5·a·T² bytes a sequence per layer as well. The same H100 held 16.05 GB (issue 54).

# %%
flash_mem = predict_memory(gpt2, one_step, weights="autocast")
eager_mem = predict_memory(gpt2, one_step, attention="eager", weights="autocast")
print(format_memory(gpt2, one_step, measured_run, flash_mem))
print(format_memory(gpt2, one_step, hardware("h100", 1, 1, attention="eager", weights="autocast"), eager_mem))
saved = eager_mem["total"] - flash_mem["total"]
print(f"FlashAttention saves {saved / 1e9:.2f} GB of scores; measured peak 16.05 GB")
assert abs(flash_mem["total"] / 16.05e9 - 1) < 0.10 and flash_mem["logits"] > flash_mem["activations"]
assert abs(saved - 12 * (5 * 12 * 1024 * 1024 * 16 - 4 * 12 * 1024 * 16)) < 1    # 12 layers' scores

# %% [markdown]
# **What to remember.** A systolic array gets its 92 T ops/s only when many rows stream through a tile
# that the weights fill; a tensor core multiplies in FP16 but must add in FP32; a layer is compute-bound
# only past the ridge, which a Linear layer reaches by batch size and a persistent RNN by keeping its
# weights on chip; int8 weights are 4× smaller and lose well under a point on the digits; a real step
# runs each op at its own roof, so it takes 2–3× its FLOPs at the data sheet's peak.
#
# ## Exercises
#
# * `systolic_tile_schedule` (minidist/hardware/systolic.py): the order of the weight tiles. Check it with
#   `python -m pytest --exercise systolic_tile_schedule`.
# * `lstm_cell_backward` (minidist/nn/rnn.py): the LSTM cell's backward. Check it with
#   `python -m pytest --exercise lstm_cell_backward`.
# * Try: an output-stationary array (each PE keeps C[r, j]) — count its cycles against the closed form.
