# %% [markdown]
# # 02 — Optimizers: where the smarts are in training
#
# **Goal.** Backpropagation (lesson 01) gives the gradient G of the loss; the *optimizer* decides what to
# do with it. This lesson runs minidist's optimizers — SGD, momentum, Nesterov, RMSprop, Adam and AMSGrad,
# whose update rules are torch.optim's step for step — on
#
# 1. the "Hardware Accelerators" tutorial's toy y(w1, w2) = (w1·w2 − 1)², with its saddle point at (0, 0),
# 2. a small MLP on the real 8×8 digits,
#
# checks the slide's claim that momentum is a weighted moving average of the gradients, shows where the
# slide's momentum and torch's momentum part ways (when the learning rate changes), and builds the Adam
# counter-example the slides leave as an exercise: a convex problem where Adam converges to the *worst*
# point while AMSGrad finds the best. It ends with the learning-rate schedules used for large batches and
# SAG, the stochastic average gradient, against SGD on least squares.
#
# Formulas are from Pedram & Olukotun, "Hardware Accelerators for Training DNNs" ("Classical GD with
# momentum", "SGD with momentum as gradients averaging", "Adagrad and RMSProp", "Adam", "Minima: Good,
# Bad and Ugly") and the slides "Distributed Deep Learning (Part II)" ("Linear Scaling Rule").
#
# Exercises: `sgd_momentum` (minidist/optim/sgd.py) and `adam` (minidist/optim/adam.py); see
# lessons/EXERCISES.md. Run their tests with `python -m pytest --exercise sgd_momentum`.

# %%
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from minidist.data import iterate_batches, load_digits
from minidist.nn import CrossEntropyLoss, Linear, Parameter, ReLU, Sequential
from minidist.optim import SAG, SGD, Adam, RMSprop
from minidist.optim.schedule import Cosine, LinearScalingRule, LinearWarmup
from minidist.sim.plots import figures_dir, save_figure

FIGURES = figures_dir()  # figures/, or $MINIDIST_FIGURES (the tests use a temporary folder)

# %% [markdown]
# ## 1. The optimizers on the tutorial's toy surface
#
# The slides' "deep linear network" has one input, one hidden unit and two weights; its error is
#
#     y(w1, w2) = (w1·w2 − 1)²,    ∂y/∂w1 = 2(w1·w2 − 1)·w2,    ∂y/∂w2 = 2(w1·w2 − 1)·w1.
#
# It is non-convex, has no local minima — every minimum is global, the whole hyperbola w1·w2 = 1 — and
# a saddle at (0, 0), where the gradient vanishes and the Hessian [[0, −2], [−2, 0]] has eigenvalues ±2.
# An optimizer needs only the gradient, so we drive each one with a single 2-element `Parameter` whose
# `.grad` we fill in ourselves. The update rules (torch's conventions):
#
# * SGD: w −= γ g.   Momentum: b = μ b + g; w −= γ b.   Nesterov: w −= γ (g + μ b).
# * RMSprop: v = α v + (1 − α) g²; w −= γ g / (√v + ε).
# * Adam: m, v moving averages of g and g², bias-corrected: w −= γ m̂ / (√v̂ + ε).


# %%
def toy_loss_and_grad(w: np.ndarray) -> tuple[float, np.ndarray]:
    r = w[0] * w[1] - 1.0
    return r * r, np.array([2 * r * w[1], 2 * r * w[0]])


OPTIMIZERS = {  # name -> a function of the parameter list; the learning rates suit this surface
    "SGD": lambda ps: SGD(ps, lr=0.05),
    "momentum": lambda ps: SGD(ps, lr=0.05, momentum=0.9),
    "Nesterov": lambda ps: SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
    "RMSprop": lambda ps: RMSprop(ps, lr=0.02),
    "Adam": lambda ps: Adam(ps, lr=0.05),
}


def descend(make_optimizer, start, steps=300):
    """Path (steps + 1, 2) and losses (steps,) of an optimizer on the toy surface."""
    w = Parameter(np.array(start, dtype=np.float64))
    optimizer = make_optimizer([w])
    path, losses = [w.data.copy()], []
    for _ in range(steps):
        loss, grad = toy_loss_and_grad(w.data)
        losses.append(loss)
        w.grad[...] = grad
        optimizer.step()
        path.append(w.data.copy())
    return np.array(path), np.array(losses)


# %% [markdown]
# First the saddle itself. At (0, 0) the gradient is exactly zero, so *no* gradient method moves: a saddle
# is a fixed point. What makes stochastic training escape is that it never sits exactly there (noise,
# random initialisation).

# %%
for name, make in OPTIMIZERS.items():
    path, _ = descend(make, (0.0, 0.0), steps=20)
    assert np.all(path == 0.0), name
print("started exactly at the saddle (0, 0): every optimizer stays there (the gradient is 0)")

# %% [markdown]
# Now start next to it, at (0.02, 0.05), and from two other points. The loss near the saddle is flat
# (y ≈ 1, gradient ≈ 2·|w|), so plain SGD creeps away; momentum accumulates the small gradients, and the
# adaptive methods divide by √v, so their steps do not shrink with the gradient (Adam's first step is γ,
# RMSprop's γ/√(1 − α) = 10γ: RMSprop has no bias correction).

# %%
STARTS = [(0.02, 0.05), (-1.5, 0.1), (1.8, -0.3)]
runs = {(name, start): descend(make, start) for start in STARTS for name, make in OPTIMIZERS.items()}

print(f"{'start':>14s} {'optimizer':>10s} {'steps to y<1e-4':>16s} {'end point':>22s} {'w1*w2':>8s}")
for (name, start), (path, losses) in runs.items():
    reached = int(np.argmax(losses < 1e-4))
    assert losses[-1] < 1e-8 and losses[reached] < 1e-4, (name, start)  # every one finds a global minimum
    end = path[-1]
    print(f"{start!s:>14s} {name:>10s} {reached:16d}   ({end[0]:+.3f}, {end[1]:+.3f})    "
          f"{end[0] * end[1]:.5f}")

near_saddle = {name: int(np.argmax(runs[(name, STARTS[0])][1] < 1e-4)) for name in OPTIMIZERS}
assert near_saddle["momentum"] < near_saddle["SGD"] and near_saddle["Nesterov"] < near_saddle["momentum"]
assert near_saddle["RMSprop"] < near_saddle["SGD"]
ends = np.array([runs[(name, STARTS[1])][0][-1] for name in OPTIMIZERS])
assert np.ptp(ends[:, 0]) > 0.5
print(f"from {STARTS[1]} the optimizers end on different points of the valley w1·w2 = 1: w1 from "
      f"{ends[:, 0].min():+.2f} to {ends[:, 0].max():+.2f}")

# %% [markdown]
# "All minima are global, some are better than others": the optimizers land on *different* points of the
# valley — which minimum training finds depends on the optimizer, one reason the choice matters for
# generalisation, not only for speed. The figure draws the paths on log y.

# %%
grid = np.linspace(-2.2, 2.2, 300)
W1, W2 = np.meshgrid(grid, grid)
surface = np.log10((W1 * W2 - 1) ** 2 + 1e-4)
fig, axes = plt.subplots(1, len(STARTS), figsize=(15, 5.4), layout="compressed")
colors = dict(zip(OPTIMIZERS, ["black", "tab:blue", "tab:green", "tab:orange", "tab:red"]))
for ax, start in zip(axes, STARTS):
    ax.contourf(W1, W2, surface, levels=30, cmap="Greys_r", alpha=0.8)
    hyperbola = np.linspace(0.45, 2.2, 100)
    for sign in (1, -1):
        ax.plot(sign * hyperbola, sign / hyperbola, "w--", lw=1)
    for name in OPTIMIZERS:
        path = runs[(name, start)][0]
        ax.plot(path[:, 0], path[:, 1], "-", color=colors[name], lw=1.6, label=name)
        ax.plot(path[-1, 0], path[-1, 1], "o", color=colors[name], ms=5)
    ax.plot(*start, "k*", ms=12)
    ax.plot(0, 0, "wx", ms=10, mew=2)
    ax.set(title=f"start {start}", xlabel="w1", ylabel="w2", xlim=(-2.2, 2.2), ylim=(-2.2, 2.2),
           aspect="equal")
axes[0].legend(loc="lower left")
fig.suptitle("y(w1, w2) = (w1·w2 − 1)²  (log scale; dashed: the valley of minima w1·w2 = 1; x: the saddle)")
save_figure(fig, "02_toy_trajectories.png", dpi=90)
plt.close(fig)

# %% [markdown]
# ## 2. Momentum is a weighted moving average of the gradients
#
# The slide unrolls M(t+1) = β M(t) − λ G(t) (constant λ, M(0) = 0) into
#
#     M(t+1) = −λ · Σ_{k=0..t} β^{t−k} G(k):
#
# each weight update is −λ times an exponentially weighted sum of all gradients so far; β sets the
# window (about 1/(1 − β) steps). Check it on minidist's SGD: feed random gradients, and compare every
# displacement w(t+1) − w(t) with the sum.

# %%
rng = np.random.default_rng(0)
beta, lam, steps = 0.9, 0.1, 40
grads = rng.normal(size=(steps, 5))
w = Parameter(np.zeros(5))
sgd = SGD([w], lr=lam, momentum=beta)
for t in range(steps):
    before = w.data.copy()
    w.grad[...] = grads[t]
    sgd.step()
    weights = beta ** np.arange(t, -1, -1)  # β^(t−k) for k = 0..t
    np.testing.assert_allclose(w.data - before, -lam * weights @ grads[: t + 1], rtol=1e-12, atol=1e-14)
print(f"momentum {beta}: every one of {steps} steps equals −λ·Σ β^(t−k) G(k) (to 1e-12); the weight of a "
      f"gradient 10 steps old is {beta ** 10:.2f}, 1/(1 − β) = {1 / (1 - beta):.0f}")

# %% [markdown]
# **Where the slide and torch differ.** torch (and minidist) keep the buffer without the learning rate —
# b = μ b + g, w −= γ b — so when γ changes, the *whole* accumulated velocity is rescaled at once. The
# slide's M carries λ inside: the past keeps the rates it was taken with. Same trajectory while γ is
# constant; different after a change. Drop γ tenfold at step 20 and compare with the slide's recursion:

# %%
w = Parameter(np.zeros(5))
sgd = SGD([w], lr=lam, momentum=beta)
M, w_slide = np.zeros(5), np.zeros(5)
gap = []
for t in range(steps):
    rate = lam if t < 20 else lam / 10
    sgd.lr = rate
    w.grad[...] = grads[t]
    sgd.step()
    M = beta * M - rate * grads[t]  # the slide: M(t+1) = β M(t) − λ(t) G(t); W(t+1) = W(t) + M(t+1)
    w_slide = w_slide + M
    gap.append(np.abs(w.data - w_slide).max())
gap = np.array(gap)
assert gap[:20].max() < 1e-12 and gap[20:].min() > 1e-3
print(f"|torch form − slide form|: {gap[:20].max():.1e} before the lr drop, {gap[20]:.3f} right after it")

# %% [markdown]
# ## 3. A small MLP on the real digits
#
# 1,437 training images of 8×8 digits, a 64–64–10 MLP with ReLU, softmax cross-entropy, mini-batches of
# 64, 20 epochs, the same initial weights and batch order for every optimizer.

# %%
digits = load_digits()


def train_digits(make_optimizer, epochs=20, batch_size=64, seed=0):
    rng = np.random.default_rng(seed)
    model = Sequential(Linear(64, 64, rng=rng), ReLU(), Linear(64, 10, rng=rng))
    optimizer, criterion, losses = make_optimizer(model.parameters()), CrossEntropyLoss(), []
    for _ in range(epochs):
        for batch in iterate_batches(len(digits.y_train), batch_size, rng):
            optimizer.zero_grad()
            losses.append(criterion.forward(model(digits.x_train[batch]), digits.y_train[batch]))
            model.backward(criterion.backward())
            optimizer.step()
    accuracy = float((model(digits.x_test).argmax(axis=1) == digits.y_test).mean())
    return np.array(losses), accuracy


DIGIT_OPTIMIZERS = {
    "SGD (γ=0.05)": lambda ps: SGD(ps, lr=0.05),
    "momentum 0.9 (γ=0.05)": lambda ps: SGD(ps, lr=0.05, momentum=0.9),
    "Nesterov 0.9 (γ=0.05)": lambda ps: SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
    "RMSprop (γ=1e-3)": lambda ps: RMSprop(ps, lr=1e-3),
    "Adam (γ=1e-3)": lambda ps: Adam(ps, lr=1e-3),
}
curves = {}
print(f"{'optimizer':24s} {'first-epoch loss':>16s} {'last-epoch loss':>16s} {'test accuracy':>14s}")
for name, make in DIGIT_OPTIMIZERS.items():
    losses, accuracy = train_digits(make)
    per_epoch = losses.reshape(20, -1).mean(axis=1)
    curves[name] = (losses, accuracy)
    print(f"{name:24s} {per_epoch[0]:16.3f} {per_epoch[-1]:16.4f} {accuracy:14.3f}")
    assert per_epoch[-1] < per_epoch[0] / 4, name  # every optimizer trains

last = {name: losses.reshape(20, -1)[-1].mean() for name, (losses, _) in curves.items()}
assert last["momentum 0.9 (γ=0.05)"] < last["SGD (γ=0.05)"] / 3  # same γ: momentum is far ahead
assert all(acc > 0.9 for name, (_, acc) in curves.items() if not name.startswith("SGD"))

fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
for name, (losses, accuracy) in curves.items():
    smooth = np.convolve(losses, np.ones(11) / 11, mode="valid")
    ax.plot(smooth, label=f"{name}: test acc {accuracy:.3f}")
ax.set(yscale="log", xlabel="step (mini-batch of 64)", ylabel="training loss (moving average of 11)",
       title="64-64-10 MLP on the 8×8 digits, 20 epochs")
ax.legend()
save_figure(fig, "02_digits_loss.png", dpi=90)
plt.close(fig)

# %% [markdown]
# ## 4. "There is a bug in this algorithm. Can you build a counterexample?"
#
# The slide on Adam ends with that exercise, pointing to Reddi, Kale & Kumar, "On the convergence of Adam
# and beyond" (ICLR 2018). Their counter-example is an online convex problem on x ∈ [−1, 1]:
#
#     f_t(x) = C·x   if t mod 3 = 1,      f_t(x) = −x   otherwise,      C > 2.
#
# Over a cycle the sum is (C − 2)·x, minimised at x = −1. Take β1 = 0 and β2 = 1/(1 + C²). The large
# gradient C comes once every three steps; v jumps up, and the step against it is about γ. Then v
# *shrinks* again (β2 is small), so the two steps of gradient −1 are divided by a small √v and are nearly
# as large: together they beat the one step toward −1, and Adam drifts to x = +1 — the worst point.
# AMSGrad divides by the running *maximum* of v, so the rare large gradient keeps its weight and the
# iterate goes to −1. We follow the paper: step size α/√t and projection back onto [−1, 1].

# %%
C, T, alpha = 3.0, 6000, 0.05


def online_problem(amsgrad: bool) -> tuple[np.ndarray, np.ndarray]:
    """Iterates x_t and average regret R_t / t = (1/t) Σ (f_s(x_s) − f_s(−1))."""
    x = Parameter(np.array([0.0]))
    adam = Adam([x], lr=alpha, betas=(0.0, 1 / (1 + C * C)), amsgrad=amsgrad)
    xs, regret = np.empty(T), np.empty(T)
    for t in range(1, T + 1):
        slope = C if t % 3 == 1 else -1.0
        regret[t - 1] = slope * x.data[0] - slope * -1.0
        adam.lr = alpha / math.sqrt(t)
        x.grad[...] = slope
        adam.step()
        np.clip(x.data, -1.0, 1.0, out=x.data)  # projection onto the feasible set [−1, 1]
        xs[t - 1] = x.data[0]
    return xs, np.cumsum(regret) / np.arange(1, T + 1)


x_adam, regret_adam = online_problem(amsgrad=False)
x_ams, regret_ams = online_problem(amsgrad=True)
print(f"after {T} steps: Adam x = {x_adam[-1]:+.3f} (average regret {regret_adam[-1]:.3f}),"
      f" AMSGrad x = {x_ams[-1]:+.3f} (average regret {regret_ams[-1]:.3f}); the optimum is x = −1")
assert x_adam[-300:].min() > 0.99  # Adam sits at the worst point of [−1, 1]
assert x_ams[-300:].max() < -0.85 and x_ams[-1] < x_ams[T // 2]  # AMSGrad heads for the optimum
assert regret_adam[-1] > 0.5 and regret_ams[-1] < 0.2  # Adam's regret per step does not vanish

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
ax1.plot(x_adam, label="Adam", color="tab:red")
ax1.plot(x_ams, label="AMSGrad", color="tab:blue")
ax1.axhline(-1, color="k", ls=":", lw=1)
ax1.set(xlabel="step t", ylabel="x_t", title=f"iterate (optimum x = −1), C = {C:g}, β1 = 0, β2 = 1/(1+C²)")
t_axis = np.arange(1, T + 1)
ax2.plot(t_axis, regret_adam, label="Adam", color="tab:red")
ax2.plot(t_axis, regret_ams, label="AMSGrad", color="tab:blue")
ax2.set(xlabel="step t", ylabel="R_t / t", xscale="log", title="average regret")
for ax in (ax1, ax2):
    ax.legend()
save_figure(fig, "02_adam_counterexample.png", dpi=90)
plt.close(fig)

# %% [markdown]
# ## 5. Learning-rate schedules for large batches
#
# Data parallelism (lessons 06 and 07) multiplies the batch. The Part II slides' "Linear Scaling Rule" (Goyal
# et al. 2017): a batch k times larger gets a learning rate k times larger, lr = base_lr · batch /
# base_batch — and, because large rates destabilise the first steps, a gradual warm-up from base_lr.
# minidist's schedules are plain functions of the step, called once per step before `optimizer.step()`:
# `optimizer.lr = schedule(step)`.

# %%
steps = np.arange(1000)
schedules = {
    "LinearScalingRule(0.1, 8192, 256, warmup 100)": LinearScalingRule(0.1, 8192, 256, warmup_steps=100),
    "LinearWarmup(Cosine(3.2, 1000), 100, start 1/32)":
        LinearWarmup(Cosine(3.2, 1000), 100, start_factor=1 / 32),
}
fig, ax = plt.subplots(figsize=(8, 4), constrained_layout=True)
for label, schedule in schedules.items():
    ax.plot(steps, [schedule(int(k)) for k in steps], label=label)
ax.set(xlabel="step", ylabel="learning rate", title="warm-up to the linearly scaled rate 0.1·8192/256 = 3.2")
ax.legend(loc="center right")
save_figure(fig, "02_schedules.png", dpi=90)
plt.close(fig)
rule = schedules["LinearScalingRule(0.1, 8192, 256, warmup 100)"]
assert abs(rule(0) - 0.1) < 1e-15 and rule(100) == rule.peak_lr == 0.1 * 8192 / 256
print(f"linear scaling rule: lr {rule(0):.3f} at step 0, {rule(50):.3f} at step 50, "
      f"{rule(100):.3f} from step 100")

# %% [markdown]
# ## 6. SAG against SGD on least squares: a linear rate from a stored gradient per sample
#
# f(w) = (1/n) Σ_i ½(a_i·w − b_i)². SAG keeps the latest gradient y_i of every sample and steps along their
# average: w ← w − (γ/n) Σ_i y_i. One new gradient per step, like SGD, but the noise of the step
# vanishes as w converges, so with a constant rate the error falls *linearly* (a straight line on a log
# axis). SGD with the same constant rate stalls at a noise floor. (The tutorial's SAG slide shows an
# exponential moving average of gradients, M ← βM + (1 − β)G, which is momentum, not SAG.)

# %%
rng = np.random.default_rng(13)
n, d = 200, 10
a_mat, b_vec = rng.standard_normal((n, d)), rng.standard_normal(n)
w_star = np.linalg.lstsq(a_mat, b_vec, rcond=None)[0]
objective = lambda w: 0.5 * np.mean((a_mat @ w - b_vec) ** 2)
lr = 1.0 / (3 * np.max(np.sum(a_mat**2, axis=1)))
sag_w, sgd_w = Parameter(np.zeros(d)), Parameter(np.zeros(d))
sag, sgd = SAG([sag_w], lr=lr, num_samples=n), SGD([sgd_w], lr=lr)
gaps = {"SAG": [], "SGD": []}
for _epoch in range(40):
    for i in rng.integers(0, n, n):
        for w_, opt in ((sag_w, sag), (sgd_w, sgd)):
            w_.grad[...] = (a_mat[i] @ w_.data - b_vec[i]) * a_mat[i]
            opt.step(int(i)) if opt is sag else opt.step()
    gaps["SAG"].append(objective(sag_w.data) - objective(w_star))
    gaps["SGD"].append(objective(sgd_w.data) - objective(w_star))
print(f"f(w) − f* after 10, 20, 40 epochs: SAG {gaps['SAG'][9]:.1e}, {gaps['SAG'][19]:.1e}, "
      f"{gaps['SAG'][39]:.1e}; SGD {gaps['SGD'][9]:.1e}, {gaps['SGD'][19]:.1e}, {gaps['SGD'][39]:.1e}")
assert gaps["SAG"][39] < 1e-12 < 1e-5 < gaps["SGD"][39]
assert gaps["SAG"][19] < 1e-2 * gaps["SAG"][9] and gaps["SAG"][29] < 1e-2 * gaps["SAG"][19]  # linear rate

fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
for name, values in gaps.items():
    ax.semilogy(range(1, 41), np.maximum(values, 1e-17), label=name)
ax.set(xlabel="epoch (n steps)", ylabel="f(w) − f*", title=f"least squares, n = {n}, same constant rate")
ax.legend()
save_figure(fig, "02_sag_vs_sgd.png", dpi=90)
plt.close(fig)

# %% [markdown]
# **What to remember.** Momentum averages gradients over ~1/(1 − β) steps and speeds up progress along
# flat directions (the saddle, the digits); adaptive methods divide by a running RMS of the gradient so
# every coordinate moves at about the learning rate; Adam's shrinking v can let rare large gradients be
# outvoted — AMSGrad's maximum fixes that; and the learning rate is a schedule, not a constant, above all
# when the batch grows; SAG buys a linear rate with memory: one stored gradient per sample. Figures:
# figures/02_toy_trajectories.png, 02_digits_loss.png, 02_adam_counterexample.png, 02_schedules.png,
# 02_sag_vs_sgd.png.

# %% [markdown]
# ## Exercises
#
# * `sgd_momentum` — the momentum branch of `SGD._update`: b = μ·b + (1 − τ)·g (b = g on the first
#   step), then step along g + μ·b (Nesterov) or b. Check: `python -m pytest --exercise sgd_momentum`.
# * `adam` — `Adam._update`: m and v as running averages in `state["exp_avg"]`, `state["exp_avg_sq"]`
#   (in place), bias correction 1 − βᵗ, AMSGrad's running maximum. Check: `python -m pytest --exercise adam`.
#
# Hint: the tests compare trajectories with torch.optim step by step; update the state arrays in place
# (`m *= beta1; m += (1 - beta1) * g`), never rebind them.
