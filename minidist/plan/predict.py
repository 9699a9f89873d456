"""Per rank memory and step time of a layout, in closed form.

Memory (the ZeRO paper, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"): Ψ
parameters per rank cost, in mixed precision with Adam, 2Ψ (16-bit weights) + 2Ψ (16-bit gradients) + 12Ψ
(FP32 master, m, v) bytes; in FP32 4Ψ + 4Ψ + 8Ψ. ZeRO-1 divides the optimizer state by the data group,
ZeRO-2 the gradients too, ZeRO-3 the weights too. Ψ per rank: the stage's L/pp blocks, split by tp (the
experts by ep·tp), plus the embedding (first stage) or the head (last stage), whichever is larger;
Chimera holds two stages. Activations: Korthikanti's bytes per layer (model.py) × L/pp layers × the
micro-batches the first stage holds: min(M, pp) under 1F1B and ZB-H1 (pp under Chimera), × (1 + (pp −
1)/(pp·v)) interleaved; 1 without a pipeline; full recomputation adds one layer's activations, recomputed.

Time: compute priced op by op on the GPU's achieved roofs (roofline_ops.py, gpus.py) for one rank's
shapes: M micro-batches of its L/pp blocks (widths / tp, tokens / cp), the head (the last stage's, the
slowest), the optimizer on its (ZeRO-sharded) parameters; full recomputation runs each block's forward
again, selective its attention's forward; ``fused`` (torch.compile, default) or eager elementwise kernels.
Without a GPU (a Hardware built by hand, or FP32) compute = FLOPs per step / (devices · peak)
(minidist.hardware.roofline's Machine; ×8/6 on the 6N part with full recomputation, + a third of the attention
term with selective). Either is stretched by the schedule's bubble b: compute / (1 − b).
Communication by the α-β model on the link each group crosses (inside a node or between nodes,
placement tensor innermost): per layer and micro-batch tensor 4 ring all-reduces of the activations,
context 3(c − 1) K/V messages, expert 4 all-to-alls; per micro-batch 2 pipeline messages; per step the
data group's ring all-reduce of the gradients (ZeRO-1/2: reduce-scatter + all-gather, the same bytes).
Nothing is overlapped: the prediction is the step without overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minidist.cluster import LinkModel
from minidist.cluster.topology import Topology
from minidist.hardware.roofline import Machine
from minidist.sim.collective_cost import allreduce_cost

from .gpus import GPU
from .layouts import Layout
from .model import ModelSpec
from .roofline_ops import Op, embedding_ops, head_ops, layer_ops, optimizer_ops, seconds

# bytes per parameter, gradient, optimizer; per activation
PRECISIONS = {"mixed": (2, 2, 12, 2), "fp32": (4, 4, 8, 4)}


@dataclass(frozen=True)
class Hardware:
    """Per device: memory (bytes), machine (peak FLOP/s for the roofline), the cluster's topology, the
    training precision ("mixed" or "fp32"); gpu: the device whose achieved roofs price each op (None:
    FLOPs at the machine's peak), fused: torch.compile's kernels (else eager's)."""

    memory: float
    machine: Machine
    topology: Topology
    precision: str = "mixed"
    gpu: GPU | None = None
    fused: bool = True

    def __post_init__(self):
        if not self.memory > 0:
            raise ValueError(f"memory per device must be > 0 bytes, got {self.memory!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got {self.precision!r}")


@dataclass
class Prediction:
    layout: Layout
    memory: dict = field(default_factory=dict)   # bytes per rank: parameters, gradients, optimizer, activ.
    time: dict = field(default_factory=dict)     # seconds per step: compute, bubble, tp, cp, ep, pp, dp, all
    excluded: str | None = None                 # why the layout is out ("does not divide", "does not fit")


def params_per_rank(model: ModelSpec, layout: Layout) -> tuple[float, float]:
    """(Ψ of the dense part, Ψ of the experts) held by one rank of the largest stage."""
    per_stage = model.layers / layout.pp
    first, last = model.outside_params()
    outside = first + last if layout.pp == 1 else max(first, last)
    dense = (per_stage * model.dense_block_params() + outside) / layout.tp
    experts = per_stage * model.expert_params() / (layout.ep * layout.tp)
    copies = 2 if layout.schedule == "chimera" and layout.pp > 1 else 1
    return copies * dense, copies * experts


def predict_memory(model: ModelSpec, layout: Layout, precision: str = "mixed") -> dict[str, float]:
    """Bytes per rank: parameters, gradients, optimizer, activations, total."""
    per_param, per_grad, per_opt, act_item = PRECISIONS[precision]
    dense, experts = params_per_rank(model, layout)
    data, expert_data = layout.dp * layout.ep, layout.dp

    def states(per: int, sharded: bool) -> float:
        return per * (dense / data + experts / expert_data if sharded else dense + experts)

    out = {"parameters": states(per_param, layout.zero >= 3), "gradients": states(per_grad, layout.zero >= 2),
           "optimizer": states(per_opt, layout.zero >= 1)}
    per_layer = model.activation_bytes(layout.micro_batch, layout.tp, layout.cp, layout.recompute)
    per_layer *= act_item / 2
    M, P = layout.micro_batches(model), layout.pp
    held = 1.0 if P == 1 else (P if layout.schedule == "chimera" else min(M, P))
    if layout.schedule == "interleaved" and P > 1:
        held *= 1 + (P - 1) / (P * layout.chunks)
    out["activations"] = held * model.layers / P * per_layer
    if layout.recompute == "full":   # one layer's activations exist again while it is recomputed
        again = model.activation_bytes(layout.micro_batch, layout.tp, layout.cp, "none")
        out["activations"] += again * act_item / 2
    out["total"] = sum(out.values())
    return out


def link_of(layout: Layout, axis: str, topology: Topology) -> LinkModel:
    """The link a group of axis crosses: inside a node if the whole group fits in one, else between nodes."""
    span = layout.stride(axis) * getattr(layout, axis)
    return topology.intra if span <= topology.per_node else topology.inter


def predict_time(model: ModelSpec, layout: Layout, hardware: Hardware) -> dict[str, float]:
    """Seconds per step on one rank: compute, bubble, communication per axis, total."""
    lay, topo = layout, hardware.topology
    item = PRECISIONS[hardware.precision][3]
    tokens = model.batch * model.seq
    attention = 12 * model.layers * model.seq * model.d_model
    if hardware.gpu is not None and hardware.precision == "mixed":
        out = {"compute": step_compute(model, lay, hardware)["total"]}
    else:
        flops = model.flops_per_token()
        if lay.recompute == "full":
            flops += (flops - attention) / 3
        elif lay.recompute == "selective":
            flops += attention / 3
        out = {"compute": flops * tokens / (lay.devices * hardware.machine.peak)}
    bubble = lay.bubble(model)
    out["bubble"] = out["compute"] * bubble / (1 - bubble)
    M, per_stage = lay.micro_batches(model), model.layers / lay.pp
    act = lay.micro_batch * model.seq / lay.cp * model.d_model * item        # one micro-batch's activations
    link = {axis: link_of(lay, axis, topo) for axis in ("tp", "cp", "ep", "dp", "pp")}
    ring = allreduce_cost("ring", lay.tp, int(act), link["tp"].alpha, link["tp"].beta).time
    out["tp"] = 4 * per_stage * M * ring
    kv = 2 * act / lay.tp
    out["cp"] = 3 * (lay.cp - 1) * per_stage * M * (link["cp"].alpha + kv * link["cp"].beta)
    routed = model.top_k * act / lay.tp / lay.ep
    out["ep"] = (4 * (lay.ep - 1) * per_stage * M * (link["ep"].alpha + routed * link["ep"].beta)
                 if model.moe else 0.0)
    out["pp"] = 2 * M * (link["pp"].alpha + act / lay.tp * link["pp"].beta) if lay.pp > 1 else 0.0
    dense, experts = params_per_rank(model, lay)
    grad_item = PRECISIONS[hardware.precision][1]
    out["dp"] = allreduce_cost("ring", lay.dp * lay.ep, int(dense * grad_item), link["dp"].alpha,
                               link["dp"].beta).time
    if experts:
        out["dp"] += allreduce_cost("ring", lay.dp, int(experts * grad_item), link["dp"].alpha,
                                    link["dp"].beta).time
    out["total"] = sum(out.values())
    return out


def step_ops(model: ModelSpec, layout: Layout, hardware: Hardware) -> dict[str, tuple[Op, ...]]:
    """One rank's ops: "layer" (one block, one micro-batch, forward and backward), "head" and "embeddings"
    (one micro-batch), "optimizer" (the step)."""
    lay, gpu, fused = layout, hardware.gpu, hardware.fused
    dense, experts = params_per_rank(model, lay)
    sharded = dense / (lay.dp * lay.ep) + experts / lay.dp if lay.zero >= 1 else dense + experts
    return {"layer": layer_ops(model, gpu, lay.micro_batch, lay.tp, lay.cp, fused),
            "head": head_ops(model, gpu, lay.micro_batch, lay.tp, lay.cp, fused),
            "embeddings": embedding_ops(model, gpu, lay.micro_batch, lay.cp, fused),
            "optimizer": optimizer_ops(gpu, dense + experts, sharded, lay.micro_batches(model))}


def step_compute(model: ModelSpec, layout: Layout, hardware: Hardware) -> dict[str, float]:
    """Seconds of one rank's compute in a step: its L/pp blocks, recomputation, the head or the embeddings
    (the larger: the first or the last stage sets the pace; both on one stage without a pipeline) for M
    micro-batches, then the optimizer."""
    ops, lay = step_ops(model, layout, hardware), layout
    M, blocks = lay.micro_batches(model), model.layers / lay.pp
    again = [op for op in ops["layer"] if op.name.endswith("fwd")]
    if lay.recompute == "selective":
        again = [op for op in again if op.name.startswith("attention")]
    ends = [seconds(ops["head"]), seconds(ops["embeddings"])]
    out = {"layers": M * blocks * seconds(ops["layer"]),
           "recompute": M * blocks * seconds(again) if lay.recompute != "none" else 0.0,
           "head and embeddings": M * (sum(ends) if lay.pp == 1 else max(ends)),
           "optimizer": seconds(ops["optimizer"])}
    out["total"] = sum(out.values())
    return out
