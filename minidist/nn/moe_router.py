"""Top-k routing with expert capacity, the Switch load-balancing loss and the router z-loss.

Router (Switch Transformer, Fedus et al. 2021; GShard, Lepikhin et al. 2020), for tokens x (N, d) and E
experts:  logits h = x·W_rᵀ (N, E),  p = softmax(h).

* top-1 (Switch): token t goes to expert argmax p_t with gate g = p_t[e] (not renormalised, so the
  router still gets a gradient);  top-2 (GShard): the two largest, gates renormalised g_c = p_c / Σ_c' p_c'.
* capacity: C = ceil(k · capacity_factor · S / E) slots per expert per *group* of S tokens (the tokens
  of one core in the papers): k·S assignments share E experts, so capacity_factor = 1 is room for a
  perfectly balanced routing whatever k (GShard's top2gating and DeepSpeed's ``top2gating`` use
  2·cf·S/E; with the top-1 formula cf·S/E, top-2 would drop at least 1 − cf/2 of its assignments, 37.5%
  at cf = 1.25, even when perfectly balanced). Slots are given out first choice first, then in token
  order (GShard's cumsum over the one-hot choices); an assignment past C is dropped: the expert never
  sees the token, which leaves the layer with output 0 (the residual carries it on).
* GShard's random routing (``second_expert="random"``, top-2 only): the second choice is dispatched
  only with probability min(1, 2·g₂) (g₂ ≤ 1/2 its renormalised gate), so a token whose second expert
  barely matters does not take its slot; a choice not dispatched is *skipped*, not dropped.
* balance loss, per group:  aux = E · Σ_i f_i · P_i,  f_i = fraction of the tokens whose *first* choice
  is i (a count: no gradient), P_i = mean router probability of i;  averaged over the groups.
  ∂aux/∂p_t[i] = E · f_i / S (one group). Minimal (= 1) when both are uniform.
* z-loss (ST-MoE, Zoph et al. 2022):  z = (1/N) Σ_t (log Σ_i e^{h_t[i]})²,  ∂z/∂h_t = (2/N)·lse_t·p_t.

Cost: the router is one (N, d)·(d, E) product, 2·N·d·E FLOPs; routing itself is O(N·E).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from minidist.nn.checks import check_count, check_real, is_count

from .module import check_float_array


@dataclass
class Routing:
    """The decisions of one forward pass for N tokens, k choices each.

    experts (N, k) int: chosen expert of each choice;  gates (N, k): their gate values;
    kept (N, k) bool: the assignment got a slot;  slot (N, k) int: its slot in the expert's buffer;
    skipped (N, k) bool: not dispatched at all (GShard's random second choice), so neither kept nor dropped;
    probs (N, E), lse (N,): softmax and log-sum-exp of the logits;  f (G, E): first-choice fractions per
    group;  capacity: C;  groups: G.
    """

    experts: np.ndarray
    gates: np.ndarray
    kept: np.ndarray
    slot: np.ndarray
    probs: np.ndarray
    lse: np.ndarray
    f: np.ndarray
    capacity: int
    groups: int
    aux_loss: float
    z_loss: float
    skipped: np.ndarray | None = None

    @property
    def num_experts(self) -> int:
        return self.probs.shape[1]

    def assignments(self, expert: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, choices) of the kept assignments of ``expert``, in slot order (each (n_e,) int)."""
        mask = (self.experts == expert) & self.kept
        choices, tokens = np.nonzero(mask.T)  # choice-major: the order in which slots were given
        order = np.argsort(self.slot[tokens, choices], kind="stable")
        return tokens[order], choices[order]

    def tokens_per_expert(self) -> np.ndarray:
        """(E,) int: kept assignments per expert (≤ C · G)."""
        return np.bincount(self.experts[self.kept], minlength=self.num_experts)

    @property
    def dropped_tokens(self) -> int:
        """Tokens that reached no expert at all (output 0: only the residual carries them)."""
        return int((~self.kept.any(axis=1)).sum())

    @property
    def dropped_assignments(self) -> int:
        """Assignments that wanted a slot and found none (skipped second choices are not counted)."""
        wanted = ~self.kept if self.skipped is None else ~self.kept & ~self.skipped
        return int(wanted.sum())


SECOND_EXPERT = ("always", "random")


def check_routing_options(num_experts: int, k: int, capacity_factor: float, groups: int = 1,
                          second_expert: str = "always") -> None:
    """Refuse impossible settings with a message that says what is expected."""
    check_count(num_experts, "mixture of experts num_experts"), check_count(groups, "groups")
    if not is_count(k) or not 1 <= k <= num_experts:
        raise ValueError(f"top-k routing needs 1 <= k <= num_experts ({num_experts}), got k={k}")
    check_real(capacity_factor, "capacity_factor", 0.0, strict=True)
    if second_expert not in SECOND_EXPERT:
        raise ValueError(f"second_expert must be one of {SECOND_EXPERT}, got {second_expert!r}")
    if second_expert == "random" and k != 2:
        raise ValueError(f"second_expert='random' is GShard's top-2 routing: it needs k = 2, got k={k}")


def capacity(tokens_per_group: int, num_experts: int, capacity_factor: float, k: int = 1) -> int:
    """C = ceil(k · capacity_factor · S / E): slots per expert for a group of S tokens routed top-k."""
    return math.ceil(k * capacity_factor * tokens_per_group / num_experts)


def route(logits: np.ndarray, k: int, capacity_factor: float, groups: int = 1, second_expert: str = "always",
          rng: np.random.Generator | None = None) -> Routing:
    """Route N tokens given the router logits (N, E); the N tokens form ``groups`` equal groups.
    second_expert="random" (top-2): dispatch each second choice with probability min(1, 2·g₂), drawn
    from ``rng`` (required then: routing must be reproducible)."""
    check_float_array(logits, "route logits (N tokens, E experts)", ndim=2)
    n, e = logits.shape
    if n == 0:  # the balance loss is a mean over the group's tokens: 0/0 for none
        raise ValueError(f"routing needs at least one token, got logits of shape {logits.shape}")
    check_routing_options(e, k, capacity_factor, groups, second_expert)
    if second_expert == "random" and not isinstance(rng, np.random.Generator):
        raise TypeError("second_expert='random' draws its choices: pass rng=numpy.random.Generator")
    if n % groups:
        raise ValueError(f"{n} tokens do not split into {groups} equal groups")
    lse = np.logaddexp.reduce(logits, axis=1)
    probs = np.exp(logits - lse[:, None])
    experts = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(probs, experts, axis=1)
    gates = chosen if k == 1 else chosen / chosen.sum(axis=1, keepdims=True)
    s = n // groups
    cap = capacity(s, e, capacity_factor, k)
    skipped = np.zeros((n, k), dtype=bool)
    if second_expert == "random":
        skipped[:, 1] = rng.random(n) >= 2 * gates[:, 1]        # GShard: dispatch if u < 2·g₂
    kept = np.zeros((n, k), dtype=bool)
    slot = np.zeros((n, k), dtype=np.int64)
    f = np.zeros((groups, e))
    aux = 0.0
    for g in range(groups):
        rows = slice(g * s, (g + 1) * s)
        used = np.zeros(e, dtype=np.int64)  # slots already given in this group
        for c in range(k):  # first choices take slots before any second choice
            onehot = np.eye(e, dtype=np.int64)[experts[rows, c]] * ~skipped[rows, c, None]   # (S, E)
            position = (np.cumsum(onehot, axis=0) - 1 + used)[np.arange(s), experts[rows, c]]
            slot[rows, c] = position
            kept[rows, c] = (position < cap) & ~skipped[rows, c]
            used += onehot.sum(axis=0)
        f[g] = np.bincount(experts[rows, 0], minlength=e) / s
        aux += e * float(f[g] @ probs[rows].mean(axis=0)) / groups
    z = float(np.mean(lse ** 2))
    return Routing(experts, gates, kept, slot, probs, lse, f, cap, groups, aux, z, skipped)


def routing_backward(r: Routing, dgates: np.ndarray, aux_coef: float, z_coef: float) -> np.ndarray:
    """dgates (N, k): gradient of the loss w.r.t. the gates (0 where dropped). Returns dlogits (N, E) of
    the loss + aux_coef · aux + z_coef · z."""
    n, e = r.probs.shape
    k = r.experts.shape[1]
    dgates = np.where(r.kept, dgates, 0)
    chosen = np.take_along_axis(r.probs, r.experts, axis=1)
    if k == 1:
        dchosen = dgates
    else:  # g_c = p_c / S:  ∂L/∂p_c = (∂L/∂g_c − Σ_c' ∂L/∂g_c' · g_c') / S
        total = chosen.sum(axis=1, keepdims=True)
        dchosen = (dgates - (dgates * r.gates).sum(axis=1, keepdims=True)) / total
    dprobs = np.zeros_like(r.probs)
    np.put_along_axis(dprobs, r.experts, dchosen, axis=1)  # k distinct experts per token: no collisions
    s = n // r.groups
    if aux_coef:
        dprobs += aux_coef * e / (s * r.groups) * np.repeat(r.f, s, axis=0)
    # softmax backward: ∂h = p ⊙ (∂p − Σ_i p_i ∂p_i)
    dlogits = r.probs * (dprobs - (r.probs * dprobs).sum(axis=1, keepdims=True))
    if z_coef:
        dlogits += z_coef * 2.0 / n * r.lse[:, None] * r.probs
    return dlogits.astype(r.probs.dtype, copy=False)
