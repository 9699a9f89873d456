"""The Switch Transformer slide's layouts ("how the model weights / the data are split over cores",
Fedus et al., figure 9) for a SwitchTransformer on W = D·E·M ranks.

Rank r sits at (data i, expert j, model m) = (r // (E·M), (r // M) % E, r % M) and belongs to
    model_comm    the M ranks (i, j, ·): the same tokens, each a slice of every expert's d_ff (Megatron MLP)
    expert_comm   the E ranks (i, ·, m): different tokens, different experts, all-to-all between them
    replica_comm  the D ranks (·, j, m): the same weights, different tokens (data parallel)
Ranks (i, j, ·) train token set i·E + j of D·E (``token_set``); everything outside the experts
(embeddings, attention, norms, routers, head) is replicated on every rank.

    data               D = W        every rank all weights, its own tokens
    model              M = W        every rank the same tokens, a 1/M slice of every expert
    expert             E = W        every rank its own experts and its own tokens
    expert+data        D·E = W      expert groups of E ranks, replicated D times
    expert+model+data  D·E·M = W    each expert split over M ranks as well

The model layout here splits the experts (the bulk of the weights) only; attention stays replicated.
"""

from __future__ import annotations

from dataclasses import dataclass

from minidist.nn import GELU, Sequential, SwitchTransformer
from minidist.nn.runner import StepRunner
from minidist.parallel.data.sync import GradientSync
from minidist.parallel.mesh import Mesh, MeshShape
from minidist.parallel.shards import ShardWeightedLoss
from minidist.parallel.tensor import MegatronMLP

from .expert.transform import expert_parallel


@dataclass(frozen=True)
class Layout:
    name: str
    data: int = 1
    expert: int = 1
    model: int = 1

    @property
    def world_size(self) -> int:
        return self.data * self.expert * self.model

    @property
    def token_sets(self) -> int:
        return self.data * self.expert


def slide_layouts(world_size: int = 4) -> list[Layout]:
    """The slide's five layouts: the first four on ``world_size`` (even) ranks, expert+model+data on 2·2·2."""
    half = world_size // 2
    return [Layout("data", data=world_size), Layout("model", model=world_size),
            Layout("expert", expert=world_size), Layout("expert+data", data=half, expert=2),
            Layout("expert+model+data", data=2, expert=2, model=2)]


class LayoutGroups:
    """This rank's place in ``layout`` and its three communicators (every rank splits, in one order)."""

    def __init__(self, comm, layout: Layout):
        if comm.world_size != layout.world_size:
            raise ValueError(f"layout {layout.name} needs {layout.world_size} ranks "
                             f"(D·E·M = {layout.data}·{layout.expert}·{layout.model}), got {comm.world_size}")
        self.comm, self.layout = comm, layout
        shape = MeshShape([("data", layout.data), ("expert", layout.expert), ("model", layout.model)])
        mesh = Mesh.of_shape(comm, shape)
        self.coords = tuple(mesh.coords.values())            # (i, j, k): data, expert, model
        self.model_comm, self.expert_comm, self.replica_comm = (mesh.group(a) for a in ("model", "expert",
                                                                                         "data"))
        self.token_set = self.coords[0] * layout.expert + self.coords[1]


def parallelize(groups: LayoutGroups, model: SwitchTransformer) -> SwitchTransformer:
    """Split ``model`` (built the same on every rank) in place for this rank; returns it. Each rank's
    objective is its share 1/S of the mean over the S = D·E token sets: its router losses are scaled here,
    its cross-entropy by train_step."""
    layout = groups.layout
    for block in model.blocks:
        moe = block.mlp
        if moe.num_experts % layout.expert:
            raise ValueError(f"{moe.num_experts} experts cannot be spread evenly over {layout.expert} ranks")
        if layout.model > 1:
            moe.experts = [MegatronMLP(groups.model_comm, ex.layers[0], ex.layers[2], GELU())
                           for ex in moe.experts]
        moe.aux_loss_coef /= layout.token_sets
        moe.z_loss_coef /= layout.token_sets
    if layout.expert > 1:       # the replicated parameters become partial sums over the expert group
        expert_parallel(model, groups.expert_comm)
    return model


def train_step(groups: LayoutGroups, model, loss_fn, optimizer, tokens, targets) -> float:
    """One step on this rank's token set through the step runner: forward, loss (its share 1/S), backward
    (the MoE layers add their router losses' gradients); GradientSync sums the replicated parameters over
    the expert group (their partial_over) and every parameter over the replicas; update. Returns the token
    set's loss with its router losses."""
    optimizer.zero_grad()
    sync = GradientSync(model, groups.replica_comm, overlap=False)
    S = groups.layout.token_sets
    loss = StepRunner(model, ShardWeightedLoss(loss_fn, 1 / S), [sync]).forward_backward(tokens, targets)
    optimizer.step()
    return loss + model.router_loss * S


def held_weights(model: SwitchTransformer) -> dict[str, tuple]:
    """{full parameter name: (the array this rank holds, the index that cuts it from the full array)}."""
    out = {name: (p.data, ()) for name, p in model.named_parameters() if ".mlp.experts." not in name}
    for l, block in enumerate(model.blocks):
        first = getattr(block.mlp, "first_expert", 0)
        for j, ex in enumerate(block.mlp.experts):
            base = f"blocks.{l}.mlp.experts.{first + j}.layers."
            if isinstance(ex, Sequential):
                for name, p in ex.named_parameters():
                    out[base + name.removeprefix("layers.")] = (p.data, ())
            else:  # a Megatron MLP: rows of the first layer, columns of the second
                out[base + "0.weight"] = (ex.up.weight.data, (ex.up.rows,))
                out[base + "0.bias"] = (ex.up.bias.data, (ex.up.rows,))
                out[base + "2.weight"] = (ex.down.weight.data, (slice(None), ex.down.cols))
                out[base + "2.bias"] = (ex.down.bias.data, ())
    return out


def expert_holdings(model: SwitchTransformer) -> dict[int, tuple[float, float]]:
    """{expert index: (start, stop) fraction of its d_ff this rank holds} for the first MoE layer."""
    mlp = model.blocks[0].mlp
    first = getattr(mlp, "first_expert", 0)
    out = {}
    for j, ex in enumerate(mlp.experts):
        if isinstance(ex, Sequential):
            out[first + j] = (0.0, 1.0)
        else:
            d_ff = ex.down.in_features
            out[first + j] = (ex.up.rows.start / d_ff, ex.up.rows.stop / d_ff)
    return out
