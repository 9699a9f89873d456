"""Mixture-of-experts MLP: a router sends each token to k of E expert MLPs (Switch Transformer, GShard).

    y_t = Σ_{kept choices c of t} g_{t,c} · expert_{e(t,c)}(x_t)          (routing: moe_router.py)

Each expert is the transformer's MLP, Linear(d, d_ff) → GELU → Linear(d_ff, d). A token whose choices all
overflowed the capacity gets y_t = 0 (the block's residual passes x_t through unchanged).

Backward, with dy (N, d):
    expert e:   dout_e = g ⊙ dy[tokens of e]   → expert_e.backward → dx[tokens of e] += dx_e
    gates:      ∂L/∂g_{t,c} = ⟨dy_t, expert_e(x_t)⟩   — how the router learns (Switch, section 2.1)
    router:     dlogits = routing_backward(...) (+ the balance and z-losses) → dx += dlogits·W_r

Parameters grow with E while the FLOPs per token stay those of k experts:
    params ≈ d·E + E·(2·d·d_ff + d_ff + d),   forward FLOPs/token ≈ 2·d·E + k·4·d·d_ff.
"""

from __future__ import annotations

import numpy as np

from minidist.nn.checks import check_count, check_real

from .activation import GELU
from .linear import Linear
from .module import Module, Sequential, check_float_array, resolve_rng
from .moe_router import Routing, check_routing_options, route, routing_backward


def dispatch(x: np.ndarray, r: Routing) -> list[np.ndarray]:
    """x (N, d) -> one array per expert, (n_e, d): the tokens it keeps, in slot order."""
    # BEGIN SOLUTION moe_dispatch
    return [x[r.assignments(e)[0]] for e in range(r.num_experts)]
    # END SOLUTION


def combine(outputs: list[np.ndarray], r: Routing, n_tokens: int) -> np.ndarray:
    """outputs: one (n_e, d) array per expert, in dispatch's order -> y (N, d) = Σ gate · output.
    Dropped tokens stay 0."""
    # BEGIN SOLUTION moe_dispatch
    d = outputs[0].shape[1]
    y = np.zeros((n_tokens, d), dtype=outputs[0].dtype)
    for e, out in enumerate(outputs):
        tokens, choices = r.assignments(e)
        y[tokens] += r.gates[tokens, choices][:, None] * out  # a token meets an expert at most once
    return y
    # END SOLUTION


def combine_backward(dy: np.ndarray, outputs: list[np.ndarray], r: Routing) -> tuple[list, np.ndarray]:
    """dy (N, d) -> (dout: one (n_e, d) per expert, dgates (N, k)), the two gradients of ``combine``."""
    dgates = np.zeros(r.gates.shape, dtype=dy.dtype)
    douts = []
    for e, out in enumerate(outputs):
        tokens, choices = r.assignments(e)
        douts.append(r.gates[tokens, choices][:, None] * dy[tokens])
        dgates[tokens, choices] = np.einsum("nd,nd->n", dy[tokens], out)
    return douts, dgates


def dispatch_backward(dxs: list[np.ndarray], r: Routing, n_tokens: int) -> np.ndarray:
    """The transpose of ``dispatch``: add each expert's input gradient (n_e, d) back into dx (N, d)."""
    dx = np.zeros((n_tokens, dxs[0].shape[1]), dtype=dxs[0].dtype)
    for e, dxe in enumerate(dxs):
        dx[r.assignments(e)[0]] += dxe
    return dx


def expert_mlp(d_model: int, d_ff: int, *, rng: np.random.Generator, dtype) -> Sequential:
    """One expert: the transformer block's MLP, Linear(d, d_ff) → GELU → Linear(d_ff, d)."""
    return Sequential(Linear(d_model, d_ff, rng=rng, dtype=dtype), GELU(),
                      Linear(d_ff, d_model, rng=rng, dtype=dtype))


class MoE(Module):
    """Mixture-of-experts MLP with a top-k router; a drop-in for a TransformerBlock's ``mlp``.

    ``router`` is Linear(d, E, bias=False); ``experts`` a list of E expert MLPs. After forward:
    ``routing`` (the decisions), ``aux_loss`` (E·Σ f_i·P_i), ``z_loss``, and ``loss`` = aux_loss_coef ·
    aux_loss + z_loss_coef · z_loss, which the training loop adds to its loss: backward already adds its
    gradient. ``groups``: the tokens form that many equal groups, each with its own capacity and balance
    loss (a group = the tokens of one core in the papers; expert parallelism needs it to compare).
    ``second_expert="random"`` (k = 2): GShard's random dispatch of the second choice (moe_router.py),
    drawn from ``rng``, which the layer keeps for that.
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int, k: int = 1, capacity_factor: float = 1.25,
                 aux_loss_coef: float = 0.01, z_loss_coef: float = 0.0, groups: int = 1, *,
                 second_expert: str = "always", rng: np.random.Generator | None = None, dtype=np.float32):
        check_routing_options(num_experts, k, capacity_factor, groups, second_expert)
        check_count(d_model, "MoE d_model"), check_count(d_ff, "MoE d_ff")
        check_real(aux_loss_coef, "MoE aux_loss_coef", 0.0), check_real(z_loss_coef, "MoE z_loss_coef", 0.0)
        rng = resolve_rng(rng)
        self.d_model, self.d_ff, self.num_experts, self.k = int(d_model), int(d_ff), int(num_experts), int(k)
        self.capacity_factor, self.groups = float(capacity_factor), int(groups)
        self.aux_loss_coef, self.z_loss_coef = float(aux_loss_coef), float(z_loss_coef)
        self.router = Linear(d_model, num_experts, bias=False, rng=rng, dtype=dtype)
        self.experts = [expert_mlp(d_model, d_ff, rng=rng, dtype=dtype) for _ in range(num_experts)]
        self.routing: Routing | None = None
        self.second_expert = second_expert
        self.dispatch_rng = rng if second_expert == "random" else None   # the draws continue its stream

    def check_input(self, x: np.ndarray) -> np.ndarray:
        """x (N, d) or (B, T, d) -> the (N, d) view; raises before any state changes."""
        check_float_array(x, "MoE input", ndim=(2, 3))
        if x.shape[-1] != self.d_model:
            raise ValueError(f"MoE expects input of shape (N, {self.d_model}) or (B, T, {self.d_model}), "
                             f"got {x.shape}")
        x2 = x.reshape(-1, self.d_model)
        if x2.shape[0] == 0:
            raise ValueError(f"MoE needs at least one token, got input of shape {x.shape}")
        if x2.shape[0] % self.groups:
            raise ValueError(f"MoE: {x2.shape[0]} tokens do not split into groups={self.groups} equal groups")
        return x2

    def route(self, x2: np.ndarray) -> Routing:
        """Router forward and routing for tokens x2 (N, d); sets aux_loss, z_loss and loss."""
        r = route(self.router.forward(x2), self.k, self.capacity_factor, self.groups, self.second_expert,
                  self.dispatch_rng)
        self.routing, self.aux_loss, self.z_loss = r, r.aux_loss, r.z_loss
        self.loss = self.aux_loss_coef * r.aux_loss + self.z_loss_coef * r.z_loss
        return r

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: tokens, shape (N, d) or (B, T, d); returns y of the same shape."""
        x2 = self.check_input(x)
        r = self.route(x2)
        self._outputs = [expert.forward(xe) for expert, xe in zip(self.experts, dispatch(x2, r))]
        self.remember_output_shape(x.shape)
        return combine(self._outputs, r, x2.shape[0]).reshape(x.shape)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape of y; returns dx, shape of x. Adds every expert's and the router's
        gradients, the balance and z-losses' included."""
        self.check_upstream(dy)
        r, dy2 = self.routing, dy.reshape(-1, self.d_model)
        douts, dgates = combine_backward(dy2, self._outputs, r)
        dxs = [expert.backward(dout) for expert, dout in zip(self.experts, douts)]
        dx = dispatch_backward(dxs, r, dy2.shape[0])
        dx += self.router.backward(routing_backward(r, dgates, self.aux_loss_coef, self.z_loss_coef))
        return dx.reshape(dy.shape)

    def flops_per_token(self) -> int:
        """Forward FLOPs of one token: the router (2·d·E) and k experts (4·d·d_ff each)."""
        return 2 * self.d_model * self.num_experts + self.k * 4 * self.d_model * self.d_ff

    def __repr__(self) -> str:
        return (f"MoE(d_model={self.d_model}, d_ff={self.d_ff}, num_experts={self.num_experts}, k={self.k}, "
                f"capacity_factor={self.capacity_factor})")
