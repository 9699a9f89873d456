"""Expert parallelism: the E experts of a mixture-of-experts layer spread over the e ranks of a group,
E/e per rank; the tokens travel to their expert and back by all-to-all (GShard, Switch Transformer).

Every rank routes its own tokens (its batch is one routing group: capacity C = ceil(c·S/E) per expert),
then per layer:

    forward:   counts all-to-all (E/e integers per peer, so each rank can cut what it receives)
               dispatch all-to-all   tokens → the rank of their expert     (n_out rows of d)
               local experts run on what arrived: the busiest rank sets the pace
               combine all-to-all    expert outputs → the tokens' ranks       (n_in rows of d)
    backward:  the same two all-to-alls in reverse order, carrying gradients     (bytes: cost.py)
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import alltoall
from minidist.nn import Module, MoE
from minidist.nn.module import check_float_array
from minidist.nn.moe import combine, combine_backward, dispatch, dispatch_backward
from minidist.nn.moe_router import Routing, route, routing_backward
from minidist.sim.compute import charge_flops


class ExpertParallelMoE(Module):
    """The MoE layer ``moe`` (built the same on every rank) with only this rank's E/e experts kept.

    Rank q holds experts q·E/e … (q+1)·E/e − 1 (``self.experts``, ``self.first_expert``) and the whole
    router (replicated: its gradient is partial over the ranks, see ``transform.py``).
    forward(x (n, d) or (B, T, d), this rank's tokens) -> y of the same shape.
    """

    def __init__(self, comm, moe: MoE):
        if not isinstance(moe, MoE):
            raise TypeError(f"ExpertParallelMoE wraps an nn.MoE, got {type(moe).__name__}")
        e, big_e = comm.world_size, moe.num_experts
        if getattr(moe, "second_expert", "always") != "always":
            raise ValueError("ExpertParallelMoE routes every second choice (second_expert='always'): "
                             "GShard's random dispatch would need every rank to draw as one process does")
        if big_e % e:
            raise ValueError(f"{big_e} experts cannot be spread evenly over {e} ranks: the number of experts "
                             f"must be a multiple of the expert-parallel group size")
        self.comm = comm
        self.d_model, self.d_ff, self.num_experts, self.k = moe.d_model, moe.d_ff, big_e, moe.k
        self.capacity_factor, self.aux_loss_coef, self.z_loss_coef = (moe.capacity_factor, moe.aux_loss_coef,
                                                                      moe.z_loss_coef)
        self.per_rank = big_e // e
        self.first_expert = comm.rank * self.per_rank
        self.router = moe.router
        self.experts = moe.experts[self.first_expert:self.first_expert + self.per_rank]  # the rest: not ours
        self.routing: Routing | None = None
        self.sent_tokens = self.received_tokens = 0  # kept assignments that crossed to / from other ranks

    # -- the two all-to-alls (forward sends tokens, backward sends their gradients the same way) ---------
    def _to_experts(self, per_expert: list[np.ndarray]) -> list[np.ndarray]:
        """E arrays (this rank's rows for every expert) -> E/e arrays, one per local expert, holding the
        rows of every peer in rank order: concatenate per destination rank, all-to-all, cut by the counts."""
        k, counts = self.per_rank, self._counts
        by_rank = [np.concatenate(per_expert[q * k:(q + 1) * k]) for q in range(self.comm.world_size)]
        arrived = alltoall(self.comm, by_rank)
        pieces = [np.split(chunk, np.cumsum(c)[:-1]) for chunk, c in zip(arrived, counts)]
        return [np.concatenate([p[j] for p in pieces]) for j in range(k)]

    def _to_tokens(self, per_local: list[np.ndarray]) -> list[np.ndarray]:
        """The inverse of _to_experts: E/e arrays -> back to the tokens' ranks -> E arrays, one per expert."""
        k, counts, mine = self.per_rank, self._counts, self._my_counts
        cut = [np.split(a, np.cumsum(counts[:, j])[:-1]) for j, a in enumerate(per_local)]
        by_source = [np.concatenate([cut[j][s] for j in range(k)]) for s in range(len(counts))]
        return [a for q, chunk in enumerate(alltoall(self.comm, by_source))
                for a in np.split(chunk, np.cumsum(mine[q * k:(q + 1) * k])[:-1])]

    def _charge(self, rows: int, passes: int, label: str) -> None:
        """Expert compute on the simulated clock: 2 FLOPs per weight and row a forward pass (4·d·d_ff for a
        whole expert, less for a tensor-parallel slice), twice that backward."""
        weights = sum(p.size for p in self.experts[0].parameters() if p.data.ndim == 2)
        charge_flops(self.comm, passes * 2 * rows * weights, label)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: this rank's tokens, (n, d) or (B, T, d); returns y of the same shape."""
        check_float_array(x, "ExpertParallelMoE input", ndim=(2, 3))
        if x.shape[-1] != self.d_model:
            raise ValueError(f"ExpertParallelMoE expects input (n, {self.d_model}) or "
                             f"(B, T, {self.d_model}), got {x.shape}")
        x2 = x.reshape(-1, self.d_model)
        # 1. route my tokens (the router is replicated; my batch is one capacity group)
        r = route(self.router.forward(x2), self.k, self.capacity_factor)
        self.routing, self.aux_loss, self.z_loss = r, r.aux_loss, r.z_loss
        self.loss = self.aux_loss_coef * r.aux_loss + self.z_loss_coef * r.z_loss
        # 2. tell every rank how many rows each of its experts will get from me
        self._my_counts = r.tokens_per_expert()                                   # (E,)
        counts = np.stack(alltoall(self.comm, list(self._my_counts.reshape(self.comm.world_size, -1))))
        self._counts = counts  # (e, E/e): rows each peer sends to each of my experts
        me = self.comm.rank
        self.sent_tokens = int(self._my_counts.sum() - self._my_counts.reshape(len(counts), -1)[me].sum())
        self.received_tokens = int(counts.sum() - counts[me].sum())
        # 3. dispatch all-to-all: my tokens to their experts' ranks; my experts run on what arrived
        inputs = self._to_experts(dispatch(x2, r))
        self._charge(sum(len(a) for a in inputs), 1, "experts forward")
        outputs = [expert.forward(a) for expert, a in zip(self.experts, inputs)]
        # 4. combine all-to-all: the outputs back to the tokens' ranks, weighted by the gates there
        self._outputs = self._to_tokens(outputs)
        self.remember_output_shape(x.shape)
        return combine(self._outputs, r, x2.shape[0]).reshape(x.shape)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: gradient of this rank's loss w.r.t. y; returns dx. Adds into the router's and the local
        experts' gradients (the experts' sum over every rank's tokens)."""
        self.check_upstream(dy)
        r = self.routing
        dy2 = dy.reshape(-1, self.d_model)
        douts, dgates = combine_backward(dy2, self._outputs, r)
        # the combine's all-to-all in reverse: output gradients to the experts' ranks
        arrived = self._to_experts(douts)
        self._charge(sum(len(a) for a in arrived), 2, "experts backward")
        dxs = [expert.backward(d) for expert, d in zip(self.experts, arrived)]
        # the dispatch's all-to-all in reverse: input gradients back to the tokens' ranks
        back = self._to_tokens(dxs)
        dx = dispatch_backward(back, r, dy2.shape[0])
        dx += self.router.backward(routing_backward(r, dgates, self.aux_loss_coef, self.z_loss_coef))
        return dx.reshape(dy.shape)

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """0 charged through the unit: the products depend on the routing, so forward and backward charge
        them as they run (``_charge``). The router's 2·N·d·E is not counted, as the planner's minidist mode
        does not (plan/minidist_switch.py)."""
        return 0

    def expert_parameters(self) -> list:
        """This rank's experts' parameters (not replicated: no all-reduce over the expert group)."""
        return [p for expert in self.experts for p in expert.parameters()]

    def __repr__(self) -> str:
        return (f"ExpertParallelMoE(experts {self.first_expert}..{self.first_expert + self.per_rank - 1} of "
                f"{self.num_experts} on rank {self.comm.rank} of {self.comm.world_size})")
