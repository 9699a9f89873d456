# %% [markdown]
# # 01 — Backpropagation by hand
#
# **Goal.** Follow one training step through the HOT CHIPS tutorial's 3-layer network: the forward pass, what
# it must keep for the backward pass and how much memory that is, the backward pass written as matrix
# products, a numerical check that those products are right, and finally real training — an MLP and a
# small CNN on the real 8×8 handwritten digits — with nothing but NumPy and hand-written backward passes.
#
# The example and the rules of thumb are from the HOT CHIPS tutorial write-up, "Fundamentals of Scaling out DL
# Training" ("a network of three linear layers", "dY ... X ... dW ... dX", "the backward pass is 2X the
# compute of the forward pass", "the backward pass requires the activations computed during the forward
# pass"); the convolution view from the "Hardware Accelerators" tutorial ("Dualities in Training
# Convolution Layers").
#
# Exercises: `linear` (minidist/nn/linear.py), `cross_entropy_backward` (minidist/nn/loss.py),
# `conv2d_backward` (minidist/nn/conv.py) and `batchnorm_backward` (minidist/nn/norm.py). Run their
# tests with e.g. `python -m pytest --exercise linear`.

# %%
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from threadpoolctl import threadpool_limits  # comes with scikit-learn

from minidist.data import iterate_batches, load_digits
from minidist.nn import (
    BatchNorm2d,
    Conv2d,
    CrossEntropyLoss,
    Flatten,
    Linear,
    MaxPool2d,
    Module,
    ReLU,
    Sequential,
)
from minidist.nn.gradcheck import gradcheck
from minidist.optim import SGD
from minidist.sim.plots import figures_dir, save_figure

FIGURES = figures_dir()  # figures/, or $MINIDIST_FIGURES (the tests use a temporary folder)
START = time.perf_counter()
# Our matrices are small: one BLAS thread is fastest, and on a busy machine several BLAS threads that
# wait for each other after every small product are many times slower.
threadpool_limits(limits=1, user_api="blas")

# %% [markdown]
# ## 1. The three-layer example, forward
#
# "For each layer, the input is a vector, the output is a vector. The operation consists of multiplying
# the input vector with the matrix of weights, and then applying a point-wise nonlinearity such as
# ReLU." With a mini-batch the vectors become matrices — the write-up's diagram uses a batch of two, and so
# do we. minidist follows PyTorch: a batch is a matrix with **one sample per row**, a layer's weight is
# W (out, in), and the layer computes
#
#     Y = X · Wᵀ        X (batch, in),  W (out, in),  Y (batch, out).
#
# (The write-up draws the batch in columns, Y = W·X; the formulas below are the same with the transposes
# on the other side.)

# %%
rng = np.random.default_rng(0)
sizes = [6, 5, 4, 3]  # input, two hidden layers, output
net = Sequential(
    Linear(sizes[0], sizes[1], bias=False, rng=rng, dtype=np.float64), ReLU(),
    Linear(sizes[1], sizes[2], bias=False, rng=rng, dtype=np.float64), ReLU(),
    Linear(sizes[2], sizes[3], bias=False, rng=rng, dtype=np.float64),
)
x = rng.standard_normal((2, sizes[0]))  # a batch of two input vectors
y = net.forward(x)
print(net)
print("input", x.shape, "-> output", y.shape)

# %% [markdown]
# ## 2. Backward: dX = dY·W and dW = dYᵀ·X
#
# The loss compares the output with the labels; its gradient with respect to the output, dY, starts the
# backward pass. "Each layer computes a weight gradient (to be used to update its own weights) and an
# activation gradient (used to backpropagate to the preceding layer)." For Y = X·Wᵀ:
#
#     dW = dYᵀ · X     (out, in)     needs X, the layer's *input from the forward pass*
#     dX = dY · W      (batch, in)   needs only the weights
#
# and for ReLU, dX = dY ⊙ [X > 0]. So every Linear must keep its input and every ReLU a mask until the
# backward pass reaches it: "all the intermediate vectors/matrices need to be retained".
#
# Below we run the backward pass and redo each Linear layer's two products by hand.

# %%
labels = np.array([0, 2])
loss_fn = CrossEntropyLoss()
loss = loss_fn.forward(y, labels)
net.zero_grad()
dx = net.backward(loss_fn.backward())

# Recompute by hand, walking backward from the loss: the inputs X_l of the three Linear layers
x1 = x
x2 = np.maximum(x1 @ net[0].weight.data.T, 0)
x3 = np.maximum(x2 @ net[2].weight.data.T, 0)
dy3 = loss_fn.backward()                                    # dY of layer 3: (softmax − onehot) / batch
dw3, dx3 = dy3.T @ x3, dy3 @ net[4].weight.data             # dW = dYᵀ·X, dX = dY·W
dy2 = dx3 * (x3 > 0)                                        # through the ReLU
dw2, dx2 = dy2.T @ x2, dy2 @ net[2].weight.data
dy1 = dx2 * (x2 > 0)
dw1, dx1 = dy1.T @ x1, dy1 @ net[0].weight.data

for name, by_hand, layer in [("W1", dw1, net[0]), ("W2", dw2, net[2]), ("W3", dw3, net[4])]:
    assert np.allclose(by_hand, layer.weight.grad, rtol=1e-12, atol=1e-15), name
    print(f"d{name} {by_hand.shape}: by hand == layer.weight.grad")
assert np.allclose(dx1, dx, rtol=1e-12, atol=1e-15)
print(f"loss {loss:.4f}; dX of the input {dx.shape} matches too")

# %% [markdown]
# **Compute.** A Linear layer's forward is one product of (batch × in) by (in × out): 2·batch·in·out
# FLOPs (a multiply-add is 2). Backward is two products of the same size, dW and dX — hence the write-up's
# "the backward pass is 2X the compute of the forward pass". `Linear.flops(input_shape)` returns the
# forward count; the backward count comes from the shapes of the two products.

# %%
for layer, layer_input in [(net[0], x1), (net[2], x2), (net[4], x3)]:
    forward = layer.flops(layer_input.shape)
    batch, n_out, n_in = layer_input.shape[0], layer.out_features, layer.in_features
    backward = 2 * n_out * batch * n_in + 2 * batch * n_out * n_in  # dYᵀ·X and dY·W
    assert forward == 2 * batch * n_in * n_out and backward == 2 * forward
print("every layer: backward FLOPs = 2 × forward FLOPs")

# %% [markdown]
# ## 3. What the forward pass keeps, and how much memory it takes
#
# A layer keeps what its backward needs as arrays on itself (Linear: its input; ReLU: a boolean mask;
# Conv2d: the im2col matrix of its input windows; MaxPool2d: its input and output; BatchNorm: x̂ and
# 1/σ). We measure "arrays held by a layer after forward" and check them against the formulas
# batch·in·4 bytes (Linear, float32) and batch·out·1 byte (ReLU).
#
# The write-up's real-world figure: "Resnet-50 training in fp16 at batch size of 256 requires about 15GB of
# memory, of which 12GB is for retaining all the activations". Activations grow with the batch size;
# parameters do not.


# %%
def arrays_held(layer: Module) -> int:
    """Bytes of the NumPy arrays a layer holds besides its parameters and buffers (what forward kept)."""
    buffers = set(vars(layer).get("_buffer_names", []))
    return sum(value.nbytes for name, value in vars(layer).items()
               if isinstance(value, np.ndarray) and name not in buffers)


def activation_memory(model: Sequential, x: np.ndarray) -> list[tuple[str, int]]:
    model.forward(x)
    return [(f"{i}: {type(layer).__name__}", arrays_held(layer)) for i, layer in enumerate(model)]


def digits_mlp(rng: np.random.Generator) -> Sequential:
    return Sequential(Linear(64, 128, rng=rng), ReLU(), Linear(128, 128, rng=rng), ReLU(),
                      Linear(128, 10, rng=rng))


def digits_cnn(rng: np.random.Generator) -> Sequential:
    return Sequential(Conv2d(1, 8, 3, padding=1, rng=rng), BatchNorm2d(8), ReLU(), MaxPool2d(2),
                      Conv2d(8, 16, 3, padding=1, rng=rng), BatchNorm2d(16), ReLU(), MaxPool2d(2),
                      Flatten(), Linear(16 * 2 * 2, 10, rng=rng))


batch = 64
mlp_memory = activation_memory(digits_mlp(np.random.default_rng(1)), np.zeros((batch, 64), np.float32))
expected = [batch * 64 * 4, batch * 128, batch * 128 * 4, batch * 128, batch * 128 * 4]
assert [b for _, b in mlp_memory] == expected, mlp_memory
cnn_memory = activation_memory(digits_cnn(np.random.default_rng(1)), np.zeros((batch, 1, 8, 8), np.float32))
# Conv2d keeps its im2col matrix: batch · (C·3·3) · (H·W) floats, 9× its input for a 3×3 kernel
assert cnn_memory[0][1] == batch * 9 * 64 * 4 and cnn_memory[4][1] == batch * 8 * 9 * 16 * 4

for title, memory in [("MLP 64-128-128-10", mlp_memory), ("CNN", cnn_memory)]:
    print(f"{title}, batch {batch}: activations kept for backward")
    for name, nbytes in memory:
        print(f"    {name:16s} {nbytes / 1024:8.1f} KiB")
    print(f"    {'total':16s} {sum(b for _, b in memory) / 1024:8.1f} KiB")

mlp = digits_mlp(np.random.default_rng(1))
param_bytes = sum(p.data.nbytes for p in mlp.parameters())
batches = [1, 16, 64, 256, 1024]
totals = [sum(b for _, b in activation_memory(mlp, np.zeros((n, 64), np.float32))) for n in batches]
assert all(t * batches[0] == totals[0] * n for t, n in zip(totals, batches))  # exactly linear in the batch
per_sample = totals[0]
# derived from the layer sizes: weights + biases of 64-128-128-10 in float32; per sample, the float32
# inputs of the three Linears and the ReLUs' one-byte masks (the list `expected` above)
widths = [64, 128, 128, 10]
assert param_bytes == 4 * sum(i * o + o for i, o in zip(widths, widths[1:]))
assert per_sample == 4 * (64 + 128 + 128) + 128 + 128
crossover = param_bytes // per_sample + 1  # the first batch size whose activations outweigh the weights
assert crossover * per_sample > param_bytes >= (crossover - 1) * per_sample
print(f"MLP parameters {param_bytes} B ({param_bytes / 1024:.1f} KiB); activations {per_sample} B per "
      f"sample: more than the parameters from a batch of {param_bytes} // {per_sample} + 1 = {crossover} on")
# The "Scaling Up Training" slides write "memory usage = minibatch size x # parameters". That is not what
# we measured: activation memory is batch × (bytes kept per example), and the parameter count does not
# enter it — this MLP's 26,122 parameters keep 1,536 bytes per example (the Linears' float32 inputs and
# the ReLUs' masks). Were the slide right, activations would outweigh the weights from a batch of 1 on.
assert param_bytes // 4 == 26122 and per_sample == 1536 and crossover > 1

fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for ax, (title, memory) in zip(axes, [("MLP 64-128-128-10", mlp_memory), ("CNN on 1×8×8", cnn_memory)]):
    names, kib = [n for n, _ in memory], [b / 1024 for _, b in memory]
    ax.barh(names[::-1], kib[::-1], color="tab:blue")
    ax.set(xlabel="KiB kept from forward until backward", title=f"{title}, batch {batch}")
fig.suptitle("Activation memory per layer (what each layer's backward needs)")
fig.tight_layout()
save_figure(fig, "01_activation_memory.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ## 4. Checking a backward pass numerically
#
# A backward pass can be checked without trusting it: for a random upstream gradient g the scalar
# L = Σ g ⊙ f(x) has ∂L/∂v = what backward computes, and central differences (L(v + h) − L(v − h)) / 2h
# estimate the same derivative element by element. In float64 they agree to ~1e-9; a wrong backward is
# off by O(1). `minidist.nn.gradcheck.gradcheck` does this for the input and every parameter.


# %%
class ReLUWithoutMask(ReLU):
    """A classic bug: passing dy straight through, forgetting the mask."""

    def backward(self, dy):
        return dy


net64 = Sequential(Linear(6, 5, rng=rng, dtype=np.float64), ReLU(), Linear(5, 3, rng=rng, dtype=np.float64))
errors = gradcheck(net64, rng.standard_normal((4, 6)), rng)
print("correct network, worst relative error:", f"{max(errors.values()):.1e}", errors)
assert max(errors.values()) < 1e-6
buggy = Sequential(net64[0], ReLUWithoutMask(), net64[2])
buggy_errors = gradcheck(buggy, rng.standard_normal((4, 6)), rng)
print("without the ReLU mask, worst relative error:", f"{max(buggy_errors.values()):.2f}")
assert max(buggy_errors.values()) > 0.05

# %% [markdown]
# ## 5. Training: an MLP and a small CNN on the real digits
#
# A training step is the write-up's loop: forward, loss, backward, "update the weights", next mini-batch.
# The digits are scikit-learn's 1,797 real 8×8 scans (1,437 for training, 360 held out). The MLP sees
# 64 pixels as a vector; the CNN sees a 1×8×8 image. A convolution's backward is the Linear layer's
# dX = Wᵀ·dY, dW = dY·Xᵀ once every 3×3 window is a column of X (im2col): "if you ignore the
# convolution with sliding window, the operation is identical to MLP".


# %%
def train(model: Sequential, data, epochs: int, lr: float, seed: int) -> tuple[list[float], float]:
    """Mini-batch SGD with momentum; returns the mean training loss per epoch and the test accuracy."""
    batch_rng = np.random.default_rng(seed)
    optimizer = SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = CrossEntropyLoss()
    epoch_losses = []
    for _ in range(epochs):
        model.train()
        losses = []
        for idx in iterate_batches(len(data.y_train), 32, batch_rng):
            losses.append(loss_fn.forward(model.forward(data.x_train[idx]), data.y_train[idx]))
            optimizer.zero_grad()
            model.backward(loss_fn.backward())
            optimizer.step()
        epoch_losses.append(float(np.mean(losses)))
    model.eval()  # BatchNorm switches to its running statistics
    accuracy = float((model.forward(data.x_test).argmax(axis=1) == data.y_test).mean())
    return epoch_losses, accuracy


mlp_losses, mlp_accuracy = train(digits_mlp(np.random.default_rng(2)), load_digits(), epochs=12,
                                 lr=0.05, seed=3)
cnn_losses, cnn_accuracy = train(digits_cnn(np.random.default_rng(2)), load_digits(images=True), epochs=6,
                                 lr=0.05, seed=3)
print(f"MLP: loss {mlp_losses[0]:.3f} -> {mlp_losses[-1]:.4f}, test accuracy {mlp_accuracy:.1%}")
print(f"CNN: loss {cnn_losses[0]:.3f} -> {cnn_losses[-1]:.4f}, test accuracy {cnn_accuracy:.1%}")
assert mlp_accuracy >= 0.95 and cnn_accuracy >= 0.95
assert mlp_losses[-1] < 0.1 * mlp_losses[0] and cnn_losses[-1] < 0.1 * cnn_losses[0]

fig, ax = plt.subplots(figsize=(6.5, 3.8))
ax.plot(range(1, len(mlp_losses) + 1), mlp_losses, "o-", label=f"MLP (test accuracy {mlp_accuracy:.1%})")
ax.plot(range(1, len(cnn_losses) + 1), cnn_losses, "s-", label=f"CNN (test accuracy {cnn_accuracy:.1%})")
ax.set(yscale="log", xlabel="epoch", ylabel="mean training loss (cross-entropy)",
       title="Training on the real 8×8 digits, backward passes by hand")
ax.legend()
fig.tight_layout()
save_figure(fig, "01_loss_curves.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ## What to remember
#
# * Backward per Linear layer: dW = dYᵀ·X and dX = dY·W — two products the size of the forward one,
#   so a training step costs about 3× the forward pass.
# * dW needs the layer's input X from the forward pass: every layer keeps something until its backward
#   runs, and that memory grows with the batch size (for our MLP it outweighs the parameters from a
#   batch of 69 on; for ResNet-50 at batch 256 it is 12 of the 15 GB). Later lessons trade it away:
#   checkpointing (recompute), pipelining (fewer micro-batches in flight), spatial parallelism (smaller
#   images per device).
# * A gradient check with a random upstream gradient catches a wrong backward pass at once.

# %%
elapsed = time.perf_counter() - START
print(f"lesson 01 done in {elapsed:.1f} s; figures: 01_activation_memory.png, 01_loss_curves.png")

# %% [markdown]
# ## Exercises
#
# In a student copy (see lessons/EXERCISES.md) these bodies are cut out; each is checked on its own by
# `python -m pytest --exercise ID`:
#
# * `linear` — `Linear.forward` / `Linear.backward`: y = x·Wᵀ + b; dx = dy·W, dW = dyᵀ·x, db = Σ dy.
#   Backward *adds* into `self.weight.grad` (`+=`); reshape `(..., in)` inputs to 2-D first.
# * `conv2d_backward` — `Conv2d.backward` from the im2col columns forward kept (`self._cols`, (K, N, Ho·Wo)):
#   dW = Σₙ dYₙ·colsₙᵀ, db = Σ dy, and dx by adding Wᵀ·dYₙ back onto the padded input (col2im).
# * `batchnorm_backward` — the batch-norm backward through the batch mean and variance:
#   dx = (γ/σ)·(dy − mean(dy) − x̂·mean(dy·x̂)), means over every axis but the channel axis.
# * `cross_entropy_backward` — `CrossEntropyLoss.backward`: (softmax(z) − onehot(t)) / N from `self._probs`.
#
# Hint: `minidist.nn.gradcheck.gradcheck(layer, x, rng)` tells you which gradient is wrong.
