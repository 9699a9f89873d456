"""Diagnosing an optimizer in its own terms: the step and the state that diverged first.

The reference recurrences, written out here from their formulas (torch.optim's documented ones), run
beside the optimizer on one float64 parameter; after every step each state array, then the parameter,
is compared (relative 1e-12):
    SGD   b_1 = g_1, b_t = μ b + (1 − τ) g;  w −= lr · (g + μ b if Nesterov else b)   (g += λ w first)
    Adam  m = β1 m + (1 − β1) g, v = β2 v + (1 − β2) g² (v̂ = running max with AMSGrad);
          w −= lr / (1 − β1^t) · m / (√v̂ / √(1 − β2^t) + ε)                         (g += λ w first)
"""

import numpy as np

from minidist.nn import Parameter
from tests.nn.backward_diagnosis import first_off


def sgd_reference(w, grads, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0):
    w, b = w.copy(), None
    for g in grads:
        g = g + weight_decay * w
        if momentum:
            b = g.copy() if b is None else momentum * b + (1 - dampening) * g
            g = g + momentum * b if nesterov else b
        w = w - lr * g
        yield w, ({"momentum_buffer": b} if momentum else {})


def adam_reference(w, grads, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False):
    (b1, b2), w = betas, w.copy()
    m, v, vmax = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        g = g + weight_decay * w
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        vmax = np.maximum(vmax, v)
        used = vmax if amsgrad else v
        w = w - lr / (1 - b1 ** t) * m / (np.sqrt(used) / np.sqrt(1 - b2 ** t) + eps)
        yield w, {"exp_avg": m, "exp_avg_sq": v, **({"max_exp_avg_sq": vmax} if amsgrad else {})}


def diagnose_optimizer(make, reference, what: str, steps: int = 4, seed: int = 0) -> str | None:
    """make(params) -> optimizer; reference(w, grads) -> (w, state) per step. The first divergence."""
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal(5)
    grads = [rng.standard_normal(5) for _ in range(steps)]
    param = Parameter(w0.copy())
    optimizer = make([param])
    for t, (g, (want_w, want_state)) in enumerate(zip(grads, reference(w0, grads), strict=True), 1):
        param.grad = g.copy()
        optimizer.step()
        for name, want in want_state.items():
            got = optimizer.state[0].get(name, np.full(5, np.nan))
            wrong = first_off(f"state[{name!r}]", got, want, 1e-12)
            if wrong:
                return f"{what}, step {t}: {wrong}"
        wrong = first_off("the parameter", param.data, want_w, 1e-12)
        if wrong:
            return f"{what}, step {t}: {wrong}"
    return None


def diagnose_trust_ratio(lamb_trust_ratio) -> str | None:
    """lamb_trust_ratio(w, u) on layers whose norms are known; the first wrong case, said with the norms."""
    cases = ((np.array([3.0, 4.0]), np.array([0.0, 2.5]), 2.0, "|w| = 5, |u| = 2.5"),
             (np.zeros(3), np.ones(3), 1.0, "w = 0 (a freshly zeroed layer)"),
             (np.ones(4), np.zeros(4), 1.0, "u = 0 (nothing to do)"),
             (np.zeros(2), np.zeros(2), 1.0, "w = 0 and u = 0"))
    for w, u, want, what in cases:
        got = float(lamb_trust_ratio(w, u))
        if not np.isclose(got, want, rtol=1e-12):
            hint = {0.5: " (that is |u| / |w|)", 4.0: " (that is the squared norms' ratio)"}.get(got, "")
            return f"lamb_trust_ratio with {what}: expected {want}, got {got}{hint}"
    return None
