# %% [markdown]
# # 23 — Sharp and flat minima: measuring the curvature at the end of training
#
# **Goal.** The "Distributed Deep Learning (Part II)" slides: "larger batch leads to sub-optimal
# generalization; a common belief is that large batch training gets attracted to sharp minimas" (Keskar
# et al., "On Large-Batch Training for Deep Learning: Generalization Gap and Sharp Minima"). The
# "Hardware Accelerators for Training Deep Neural Networks" tutorial: "there are no local (ugly) minima,
# only good (flat) and bad (sharp)". Lesson 07 measured the generalisation gap; here we measure the
# sharpness itself — the largest eigenvalue λmax of the Hessian of the training loss — at the end of
# small-batch and large-batch training, and draw Goodfellow's loss along the line from the initial to
# the final weights.
#
# The tools: `minidist.nn.hessian` forms H·v for any model as the derivative of the gradient along v, by
# central differences of two backward passes (plus one Richardson step: error O(ε⁴));
# `minidist.nn.hessian_exact` differentiates an MLP's backward pass itself (Pearlmutter's R-operator:
# exact, no step). λmax follows by power iteration v ← H·v / |H·v|. Both are checked against PyTorch's
# double backward in `tests/nn` (to 1e-8 and 1e-12).

# %%
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from threadpoolctl import threadpool_limits  # comes with scikit-learn

from minidist.data import iterate_batches, load_digits
from minidist.nn import CrossEntropyLoss, Linear, Sequential, Tanh
from minidist.nn.hessian import flatten, hessian_vector_product, sharpness
from minidist.nn.hessian_exact import exact_hessian_vector_product
from minidist.optim import LARS, SGD
from minidist.recipes.demo import accuracy, digits_mlp
from minidist.sim.plots import save_figure

threadpool_limits(limits=1, user_api="blas")  # small products: one BLAS thread is faster on a busy machine
DATA, LOSS = load_digits(), CrossEntropyLoss()
EPOCHS, MOMENTUM = 30, 0.9


def tanh_mlp(rng: np.random.Generator) -> Sequential:
    """The digits MLP of lessons 01-07 (64 -> 64 -> 64 -> 10) with Tanh instead of ReLU, in float64."""
    return Sequential(Linear(64, 64, rng=rng, dtype=np.float64), Tanh(),
                      Linear(64, 64, rng=rng, dtype=np.float64), Tanh(),
                      Linear(64, 10, rng=rng, dtype=np.float64))


def set_weights(model: Sequential, weights: list[np.ndarray]) -> Sequential:
    for p, w in zip(model.parameters(), weights):
        p.data[...] = w
    return model


def losses(model: Sequential) -> tuple[float, float]:
    return (float(LOSS.forward(model(DATA.x_train), DATA.y_train)),
            float(LOSS.forward(model(DATA.x_test), DATA.y_test)))


def lambda_max(model: Sequential, product=exact_hessian_vector_product) -> float:
    """λmax of the Hessian of the full training loss (power iteration to 0.1%)."""
    return sharpness(model, LOSS, DATA.x_train, DATA.y_train, np.random.default_rng(0), iterations=60,
                     tol=1e-3, product=product)[0]


# %% [markdown]
# ## 1. The two products, and why the runs below use Tanh
#
# A ReLU network's gradient *jumps* where a pre-activation crosses 0: a difference of gradients taken
# across such a kink divides a jump by 2ε, and over 1,437 images × 128 hidden units some pre-activation
# always lies within reach of the step. The exact product treats ReLU'' as 0 (as autograd does), i.e.
# ignores the jumps. Below: lesson 01's ReLU MLP after 8 epochs, λmax by both products; then the same
# comparison on a Tanh MLP, whose loss is smooth. A Hessian is also symmetric, uᵀ(Hv) = vᵀ(Hu): a check
# that needs no oracle.

# %%
relu = digits_mlp(np.random.default_rng([0, 0]), dtype=np.float64)
optimizer, order = SGD(relu.parameters(), lr=0.05, momentum=MOMENTUM), np.random.default_rng([0, 1])
for _ in range(8):
    for index in iterate_batches(len(DATA.y_train), 32, order):
        relu.zero_grad()
        LOSS.forward(relu(DATA.x_train[index]), DATA.y_train[index])
        relu.backward(LOSS.backward())
        optimizer.step()
relu_exact, relu_differences = lambda_max(relu), lambda_max(relu, hessian_vector_product)
print(f"ReLU MLP, training loss {losses(relu)[0]:.3f}: λmax {relu_exact:.2f} (exact), "
      f"{relu_differences:.2f} (central differences)")
assert abs(relu_differences - relu_exact) > 0.3 * relu_exact      # the kinks spoil the differences

probe = tanh_mlp(np.random.default_rng([0, 0]))
rng = np.random.default_rng(1)
u, v = ([rng.standard_normal(p.data.shape) for p in probe.parameters()] for _ in range(2))
hu = flatten(hessian_vector_product(probe, LOSS, DATA.x_train, DATA.y_train, u))
hv = flatten(hessian_vector_product(probe, LOSS, DATA.x_train, DATA.y_train, v))
hv_exact = flatten(exact_hessian_vector_product(probe, LOSS, DATA.x_train, DATA.y_train, v))
gap = np.abs(hv - hv_exact).max() / np.abs(hv_exact).max()
print(f"Tanh MLP, {hv.size} parameters: differences against exact {gap:.1e}; "
      f"uᵀHv = {flatten(u) @ hv:.10f}, vᵀHu = {flatten(v) @ hu:.10f}")
assert gap < 1e-7 and abs(flatten(u) @ hv - flatten(v) @ hu) < 1e-7 * abs(flatten(u) @ hv)

# %% [markdown]
# ## 2. Four runs of 30 epochs, the same initial weights and batch order
#
# * B = 32, SGD lr 0.05, momentum 0.9 (the small-batch reference: 1,350 steps);
# * B = 512, the *same* rate (as Keskar et al. compared: the same optimiser settings; 90 steps);
# * B = 512, LARS (lesson 07's recipe);
# * B = 512, the linear scaling rule: lr 0.05 · 512/32 = 0.8 (Tanh trains at this rate without warm-up).
#
# Then at each end point: training and test loss, the tutorial's "generalization gap = testing loss −
# training loss", accuracies, and λmax.

# %%
RUNS = [("B = 32, lr 0.05", 32, lambda ps: SGD(ps, lr=0.05, momentum=MOMENTUM)),
        ("B = 512, lr 0.05", 512, lambda ps: SGD(ps, lr=0.05, momentum=MOMENTUM)),
        ("B = 512, LARS", 512, lambda ps: LARS(ps, lr=1.0, momentum=MOMENTUM, trust_coefficient=0.02)),
        ("B = 512, lr 0.8", 512, lambda ps: SGD(ps, lr=0.8, momentum=MOMENTUM))]
initial = [p.data.copy() for p in tanh_mlp(np.random.default_rng([0, 0])).parameters()]
ends, snapshots = {}, []
for name, batch, make_optimizer in RUNS:
    model = set_weights(tanh_mlp(np.random.default_rng([0, 0])), initial)
    optimizer, order = make_optimizer(model.parameters()), np.random.default_rng([0, 1])
    for epoch in range(1, EPOCHS + 1):
        for index in iterate_batches(len(DATA.y_train), batch, order):
            model.zero_grad()
            LOSS.forward(model(DATA.x_train[index]), DATA.y_train[index])
            model.backward(LOSS.backward())
            optimizer.step()
        if batch == 32 and epoch in (1, 2, 3, 5, 8, 12, 20):   # points along the small-batch path
            snapshots.append([p.data.copy() for p in model.parameters()])
    train_loss, test_loss = losses(model)
    ends[name] = {"weights": [p.data.copy() for p in model.parameters()], "train": train_loss,
                  "test": test_loss, "gap": test_loss - train_loss, "lambda": lambda_max(model),
                  "train acc": accuracy(model, DATA.x_train, DATA.y_train),
                  "test acc": accuracy(model, DATA.x_test, DATA.y_test)}

print(f"{'run':>17} {'train loss':>10} {'test loss':>9} {'gap':>6} {'train acc':>9} {'test acc':>8} "
      f"{'λmax':>6}")
for name, e in ends.items():
    print(f"{name:>17} {e['train']:10.4f} {e['test']:9.4f} {e['gap']:6.3f} {e['train acc']:9.1%} "
          f"{e['test acc']:8.1%} {e['lambda']:6.2f}")
small, same_lr, lars, scaled = (ends[name] for name, _, _ in RUNS)

# %% [markdown]
# ## 3. What the numbers say
#
# Keskar et al.'s direction holds for the two large-batch runs that keep the small-batch rate or
# use LARS: they end at a larger λmax than B = 32. The linearly scaled run does not: it ends *flatter*
# than the small batch. Two things decide λmax here, and neither is the batch size by itself:
#
# * **How far training got.** A cross-entropy Hessian shrinks as the softmax saturates (its output-layer
#   block is the mean of (diag(p) − ppᵀ) ⊗ hhᵀ, which vanishes as p becomes one-hot), so a run that stopped
#   at a higher training loss is also "sharper". Below, λmax along the small-batch run itself falls.
# * **The learning rate.** Gradient descent with momentum β on a quadratic of curvature λ is stable only
#   if λ < 2(1 + β)/η. At η = 0.8 that bound is 4.75 and the run has to settle where the curvature is
#   below it; at η = 0.05 the bound (76) never binds. Large rates find flat regions — the linear scaling
#   rule keeps lr/B, the noise scale of lesson 22, and with it the flatness.

# %%
assert same_lr["lambda"] > 2 * small["lambda"] and lars["lambda"] > 2 * small["lambda"]
assert scaled["lambda"] < small["lambda"]                        # the honest opposite, at lr 0.8
assert scaled["lambda"] < 2 * (1 + MOMENTUM) / 0.8                # under the stability bound
assert same_lr["train"] > 10 * small["train"] and lars["train"] > 10 * small["train"]
path = []
for weights in snapshots:
    model = set_weights(tanh_mlp(np.random.default_rng([0, 0])), weights)
    path.append((losses(model)[0], lambda_max(model)))
path.append((small["train"], small["lambda"]))
path_loss, path_lambda = np.array(path).T
print("along the B = 32 run: " + ", ".join(f"loss {a:.3f}: λmax {b:.2f}" for a, b in path))
assert path_lambda[-1] < path_lambda[0] / 4                       # the path flattens as the loss falls
# at the training loss where each large-batch run stopped, the small-batch path was about as sharp
for e in (same_lr, lars):
    at_same_loss = np.interp(np.log(e["train"]), np.log(path_loss[::-1]), path_lambda[::-1])
    print(f"λmax {e['lambda']:.2f} at training loss {e['train']:.3f}; the B = 32 path there: "
          f"{at_same_loss:.2f}")
    assert 0.5 < e["lambda"] / at_same_loss < 2

# %% [markdown]
# So, on the digits: "large batch ends sharper" is true of a fixed epoch budget with the small-batch
# rate or LARS, and it comes with a higher training loss; compared at equal training loss the sharpness
# is about the same, and the linearly scaled rate ends flatter than everything. The generalisation gaps
# (test − train loss) do not order like λmax either: one seed, 360 test images — differences of a point
# of accuracy are within the noise lesson 07 describes. And Dinh et al., "Sharp Minima Can Generalize
# For Deep Nets", showed that λmax can be changed at will by reparametrising a ReLU network without
# changing its function: sharpness is a hint, not a law.

# %% [markdown]
# ## 4. Goodfellow's line, and the loss along the sharpest direction
#
# Goodfellow, Vinyals & Saxe, "Qualitatively Characterizing Neural Network Optimization Problems" (the
# tutorial's "Loss Function Surface"): evaluate the loss along x(θ) = x₀(1 − θ) + x_min·θ from the
# initial weights x₀ (θ = 0) to the solution (θ = 1), and a little beyond. They found a smooth, nearly
# monotone descent: "we never found evidence that local minima or saddle points slowed the SGD
# trajectory". Beside it, the loss along the top eigenvector u at each end point, L(x_min + t·u), which
# grows as ½·λmax·t² near t = 0.
#
# Read the left panel with care. Between x₀ and x_min every line falls without a bump, as Goodfellow et
# al. found. But x_min is no minimum of the line: for the two runs that fit the training set the loss
# keeps falling past θ = 1 (on data the network already classifies correctly, cross-entropy falls as the
# weights grow along the same direction, while the test loss turns up), and LARS, at a constant rate,
# stopped past the line's lowest point (θ ≈ 0.7). "Minimum" at the end of training means "where the
# optimizer stopped".

# %%
thetas = np.linspace(-0.25, 1.5, 36)
lines = {}
for name in ("B = 32, lr 0.05", "B = 512, LARS", "B = 512, lr 0.8"):
    model = tanh_mlp(np.random.default_rng([0, 0]))
    train_line, test_line = [], []
    for theta in thetas:
        set_weights(model, [w0 * (1 - theta) + w1 * theta for w0, w1 in zip(initial, ends[name]["weights"])])
        train_line.append(losses(model)[0])
        test_line.append(losses(model)[1])
    lines[name] = (np.array(train_line), np.array(test_line))
    inside = np.array(train_line)[(thetas >= 0) & (thetas <= 1)]
    assert np.all(np.diff(inside) < 0.01 * inside[0]), name       # no bump between x₀ and x_min
print("training loss along the line, θ = 0, 0.5, 1, 1.5: " + "; ".join(
    f"{n}: " + ", ".join(f"{t[np.isclose(thetas, at)][0]:.4f}" for at in (0, 0.5, 1, 1.5))
    for n, (t, _) in lines.items()))
at = {theta: np.flatnonzero(np.isclose(thetas, theta))[0] for theta in (0.5, 1.0, 1.5)}
for name in ("B = 32, lr 0.05", "B = 512, lr 0.8"):                # past x_min the loss still falls
    assert lines[name][0][at[1.5]] < lines[name][0][at[1.0]]
lars_line = lines["B = 512, LARS"][0]
assert lars_line[at[0.5]:at[1.0]].min() < lars_line[at[1.0]]       # LARS stopped past the line's lowest point

steps = np.linspace(-0.6, 0.6, 41)
curves = {}
for name in ("B = 32, lr 0.05", "B = 512, lr 0.05", "B = 512, lr 0.8"):
    model = set_weights(tanh_mlp(np.random.default_rng([0, 0])), ends[name]["weights"])
    eigenvalue, direction = sharpness(model, LOSS, DATA.x_train, DATA.y_train, np.random.default_rng(0),
                                      iterations=60, tol=1e-3, product=exact_hessian_vector_product)
    curve = []
    for t in steps:
        set_weights(model, [w + t * d for w, d in zip(ends[name]["weights"], direction)])
        curve.append(losses(model)[0])
    curves[name] = np.array(curve) - ends[name]["train"]
    t = steps[21]                                                  # t = 0.03: ½λt² should match
    second = (curve[21] + curve[19] - 2 * ends[name]["train"]) / t**2
    assert abs(second - eigenvalue) < 0.1 * eigenvalue, (name, second, eigenvalue)

fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 4))
for name, (train_line, test_line) in lines.items():
    (drawn,) = ax1.semilogy(thetas, train_line, label=f"{name}: train")
    ax1.semilogy(thetas, test_line, ls="--", color=drawn.get_color(), label=f"{name}: test")
ax1.axvline(0, color="gray", lw=0.6)
ax1.axvline(1, color="gray", lw=0.6)
ax1.set(xlabel="θ   (0: initial weights, 1: end of training)", ylabel="cross-entropy",
        title="Goodfellow's line x₀(1 − θ) + x_min·θ")
ax1.legend(fontsize="x-small")
for name, curve in curves.items():
    ax2.plot(steps, curve, label=f"{name} (λmax {ends[name]['lambda']:.2f})")
ax2.set(xlabel="t, along the top eigenvector (|u| = 1)", ylabel="L(x_min + t·u) − L(x_min)",
        title="the sharpest direction at each end point")
ax2.legend(fontsize="x-small")
ax3.loglog(path_loss, path_lambda, "o-", color="tab:blue", label="B = 32, epochs 1 … 30")
for name, marker in (("B = 512, lr 0.05", "s"), ("B = 512, LARS", "^"), ("B = 512, lr 0.8", "D")):
    ax3.loglog(ends[name]["train"], ends[name]["lambda"], marker, ms=9, label=f"{name}, epoch 30")
ax3.set(xlabel="training loss", ylabel="λmax of the Hessian", title="sharpness against training loss")
ax3.legend(fontsize="x-small")
fig.tight_layout()
save_figure(fig, "23_sharp_and_flat.png")
plt.close(fig)

# %% [markdown]
# ## 5. Saddle points: gradient descent can stop on one, SGD does not
#
# The tutorial's "Loss Function Surface" slide: "large NNs have no local minima, only saddle points and a
# global minima" and "SG algorithms can easily escape from saddle points" (after Pascanu et al. and
# Dauphin et al.). A finite sum with a strict saddle (Hessian eigenvalues +1 and −1) at the origin:
#
#     f(x, y) = (1/n) Σᵢ fᵢ(x, y),   fᵢ = x²/2 − y²/2 + y⁴/4 + aᵢ·y,   Σᵢ aᵢ = 0,
#
# so f = x²/2 − y²/2 + y⁴/4: a saddle at (0, 0), minima f = −1/4 at (0, ±1). The line y = 0 is the
# saddle's stable manifold: there ∂f/∂y = −y + y³ + mean(a) = 0 *exactly*, and full-batch gradient
# descent started on it slides into the saddle and never leaves. A mini-batch B gives ∂f_B/∂y =
# −y + y³ + mean_B(a): the same step plus noise in y, which the negative curvature then amplifies by
# (1 + η) per step. (The aᵢ are multiples of 1/4, so their float sum is exactly 0.)

# %%
SADDLE_A = np.array([-1.0, -0.75, -0.5, -0.25, 0.25, 0.5, 0.75, 1.0])   # aᵢ, n = 8, Σ aᵢ = 0 exactly
SADDLE_LR, SADDLE_STEPS, SADDLE_BATCH = 0.1, 300, 2


def saddle_gradient(point: np.ndarray, a: np.ndarray) -> np.ndarray:
    """∇ of (1/|a|) Σ fᵢ at point = (x, y): (x, −y + y³ + mean(a))."""
    x, y = point
    return np.array([x, -y + y**3 + a.mean()])


def descend_saddle(seed: int | None) -> np.ndarray:
    """Trajectory (steps + 1, 2) from (1, 0); seed None: full batch, else mini-batches of SADDLE_BATCH."""
    rng, point = np.random.default_rng(seed), np.array([1.0, 0.0])
    path = [point]
    for _ in range(SADDLE_STEPS):
        a = SADDLE_A if seed is None else rng.choice(SADDLE_A, SADDLE_BATCH, replace=False)
        point = point - SADDLE_LR * saddle_gradient(point, a)
        path.append(point)
    return np.array(path)


gd_path = descend_saddle(None)
assert np.all(gd_path[:, 1] == 0.0)                              # GD's y is exactly 0 at every step
assert abs(gd_path[-1, 0]) < 1e-8                                 # ... and x reaches the saddle
print(f"GD from (1, 0): after {SADDLE_STEPS} steps at ({gd_path[-1, 0]:.1e}, {gd_path[-1, 1]}), "
      f"f = {gd_path[-1, 0] ** 2 / 2:.1e} (the saddle's value, 0)")
sgd_paths = {seed: descend_saddle(seed) for seed in range(5)}
for seed, path in sgd_paths.items():
    arrival = int(np.argmax(np.abs(np.abs(path[:, 1]) - 1) < 0.1))   # first step within 0.1 of |y| = 1
    x, y = path[-1]
    print(f"SGD seed {seed}: |y| within 0.1 of the minimum after {arrival} steps; ends at ({x:.1e}, "
          f"{y:+.3f}), f = {x**2 / 2 - y**2 / 2 + y**4 / 4:+.3f}")
    assert 0 < arrival < 100                                       # escaped, and reached a minimum
    assert np.all(np.abs(np.abs(path[150:, 1]) - 1) < 0.3)          # ... and stays near it

fig, ax = plt.subplots(figsize=(7.5, 3.2), constrained_layout=True)
ax.plot(gd_path[:, 1], color="black", lw=2, label="GD (full batch): y = 0 exactly")
for seed, path in sgd_paths.items():
    ax.plot(path[:, 1], lw=0.8, label=f"SGD, batch {SADDLE_BATCH}, seed {seed}")
ax.axhline(1, color="gray", ls=":", lw=0.8)
ax.axhline(-1, color="gray", ls=":", lw=0.8)
ax.set(xlabel="step", ylabel="y  (minima at ±1)", title="From (1, 0) on the saddle's stable manifold")
ax.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1, 0.5))
save_figure(fig, "23_saddle.png")
plt.close(fig)

# %% [markdown]
# Gradient descent needs no noise to *approach* the saddle and has nothing to *leave* it with: exactly on
# the stable manifold (a set of measure zero, so a random start almost surely misses it, but a start near
# it lingers there for long) its y-step is 0. The mini-batch's noise is what SGD adds, and along the
# negative-curvature direction it grows until the quartic term stops it at a minimum. (Not every saddle
# yields to this noise: two hidden units with equal weights get equal gradients from every mini-batch, so
# SGD keeps them equal too; that symmetry is broken by the random initialisation, not by sampling.)

# %% [markdown]
# ## What to remember
#
# * H·v costs a few backward passes (differences of gradients, or the backward pass differentiated);
#   λmax follows by power iteration — no Hessian is ever formed. On a ReLU network use the exact product:
#   differences straddle the kinks (λmax 1.16 instead of 3.82 above).
# * At the end of a fixed budget, a large batch at the small batch's rate (or with LARS) ends sharper and
#   with a larger training loss; the linear scaling rule's large rate ends flatter. The learning rate
#   bounds the sharpness a run can settle in (λ < 2(1 + β)/η).
# * Between the initial and final weights the training loss falls smoothly: no bump, no local minimum
#   on the way (Goodfellow et al.) — the landscape's difficulty is not where the slides' pictures of
#   "ugly" minima put it.
# * A strict saddle stops full-batch gradient descent started on its stable manifold (y stayed exactly 0);
#   the mini-batch's noise alone took SGD to a minimum, for every seed, within 50 steps.
