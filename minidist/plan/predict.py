"""Per rank step time of a layout, in closed form (memory: memory.py, re-exported here).

Compute priced op by op on the GPU's achieved roofs (roofline_ops.py, gpus.py) for one rank's
shapes: M micro-batches of its L/pp blocks (widths / tp, tokens / cp), the head (the last stage's, the
slowest), the optimizer on its (ZeRO-sharded) parameters and the weights' casts (once per step with 16-bit
weights, per micro-batch under autocast); full recomputation runs each block's forward
again, selective its attention's forward; ``fused`` (torch.compile, default) or eager elementwise kernels.
Without a GPU (a Hardware built by hand, or FP32) compute = FLOPs per step / (devices · peak)
(minidist.hardware.roofline's Machine; ×8/6 on the 6N part with full recomputation, + a third of the attention
term with selective). The schedule's bubble b idles b/(1 − b) of the micro-batches' work: the compute but
the optimizer (it runs once, after the flush) and the per-micro-batch messages below, since a pipeline
slot is a micro-batch's compute and its messages (Narayanan et al. 2021: (p − 1)·(t_f + t_b)).
Communication by the α-β model on the link each group crosses (inside a node or between nodes,
placement tensor innermost): per layer and micro-batch tensor 4 ring all-reduces of the activations,
context 3(c − 1) K/V messages, expert 4 all-to-alls; per micro-batch 2 pipeline messages; per step the
data group's gradients (the ZeRO paper's volumes: a ring all-reduce, 2Ψ, without ZeRO and for stages 1-2
as reduce-scatter + all-gather; stage 3 adds a gather of each layer's weights for the backward, 3Ψ).
Only ZeRO-3's per-layer gathers overlap (with the blocks' compute, the next layer's gathered while one
computes: exposed = max(0, gathers − compute)); everything else is the step without overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minidist.cluster import LinkModel
from minidist.cluster.topology import Topology
from minidist.hardware.roofline import Machine
from minidist.sim.collective_cost import allreduce_cost

from .gpus import GPU
from .layouts import Layout
from .memory import PRECISIONS, WEIGHTS, params_per_rank
from .model import ATTENTION, ModelSpec
from .roofline_ops import Op, embedding_ops, head_ops, layer_ops, optimizer_ops, seconds


@dataclass(frozen=True)
class Hardware:
    """Per device: memory (bytes), machine (peak FLOP/s for the roofline), the cluster's topology, the
    training precision ("mixed" or "fp32"); gpu: the device whose achieved roofs price each op (None:
    FLOPs at the machine's peak), fused: torch.compile's kernels (else eager's); attention: "flash"
    (FlashAttention's memory) or "eager" (the scores kept); weights: "bf16" (16-bit weights beside FP32
    masters, Megatron) or "autocast" (FP32 parameters, PyTorch autocast) — memory.py."""

    memory: float
    machine: Machine
    topology: Topology
    precision: str = "mixed"
    gpu: GPU | None = None
    fused: bool = True
    attention: str = "flash"
    weights: str = "bf16"

    def __post_init__(self):
        if not self.memory > 0:
            raise ValueError(f"memory per device must be > 0 bytes, got {self.memory!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got {self.precision!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {self.attention!r}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, got {self.weights!r}")


@dataclass
class Prediction:
    layout: Layout
    memory: dict = field(default_factory=dict)   # bytes per rank: parameters, gradients, optimizer, activ.
    time: dict = field(default_factory=dict)     # seconds per step: compute, bubble, tp, cp, ep, pp, dp, all
    excluded: str | None = None                 # why the layout is out ("does not divide", "does not fit")


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
    once = 0.0                                   # the optimizer's seconds: outside the bubble
    if hardware.gpu is not None and hardware.precision == "mixed":
        parts = step_compute(model, lay, hardware)
        out, once = {"compute": parts["total"]}, parts["optimizer"]
    else:
        flops = model.flops_per_token()
        if lay.recompute == "full":
            flops += (flops - attention) / 3
        elif lay.recompute == "selective":
            flops += attention / 3
        out = {"compute": flops * tokens / (lay.devices * hardware.machine.peak)}
    out["bubble"] = 0.0                          # set below, once the per-micro-batch messages are known
    M, per_stage = lay.micro_batches(model), model.layers / lay.pp
    act = lay.micro_batch * model.seq / lay.cp * model.d_model * item        # one micro-batch's activations
    link = {axis: link_of(lay, axis, topo) for axis in ("tp", "cp", "ep", "dp", "pp")}
    ring = allreduce_cost("ring", lay.tp, int(act), link["tp"].alpha, link["tp"].beta).time
    out["tp"] = (4 + 2 * (lay.recompute == "full")) * per_stage * M * ring   # a recomputed forward: 2 more
    kv = 2 * act / lay.tp
    out["cp"] = 3 * (lay.cp - 1) * per_stage * M * (link["cp"].alpha + kv * link["cp"].beta)
    routed = model.top_k * act / lay.tp / lay.ep
    out["ep"] = (4 * (lay.ep - 1) * per_stage * M * (link["ep"].alpha + routed * link["ep"].beta)
                 if model.moe else 0.0)
    out["pp"] = 2 * M * (link["pp"].alpha + act / lay.tp * link["pp"].beta) if lay.pp > 1 else 0.0
    out["dp"] = data_seconds(model, lay, hardware, link["dp"], out["compute"])
    bubble = lay.bubble(model)
    busy = out["compute"] - once + out["tp"] + out["cp"] + out["ep"] + out["pp"]
    out["bubble"] = busy * bubble / (1 - bubble)
    out["total"] = sum(out.values())
    return out


def data_groups(model: ModelSpec, layout: Layout) -> list[tuple[int, float]]:
    """(ranks, parameters) of each data group a rank is in: the dense part over dp · ep, experts over dp."""
    dense, experts = params_per_rank(model, layout)
    groups = [(layout.dp * layout.ep, dense)]
    return groups + [(layout.dp, experts)] if experts else groups


def data_bytes(model: ModelSpec, layout: Layout, precision: str = "mixed") -> float:
    """Bytes one rank sends over its data groups per step (the ZeRO paper's volumes, 16-bit in mixed
    precision): a ring all-reduce 2(n − 1)/n · Ψ (no ZeRO; stages 1-2: reduce-scatter + all-gather, the
    same), stage 3 a third (n − 1)/n · Ψ for the backward's gathers: 3Ψ, 1.5x."""
    item = PRECISIONS[precision][1]
    passes = 3 if layout.zero >= 3 else 2
    return sum(passes * (n - 1) / n * psi * item for n, psi in data_groups(model, layout))


def data_seconds(model: ModelSpec, layout: Layout, hardware: Hardware, link: LinkModel,
                 compute: float) -> float:
    """Exposed seconds of the data groups' traffic: the gradients' ring all-reduce (ZeRO-1/2: reduce-scatter
    + all-gather, the same bytes; ZeRO-3: reduce-scatter + the forward's gathers, the same bytes again);
    ZeRO-3's third Ψ, the backward's gathers of each layer's share (L/pp ring all-gathers), runs under the
    blocks' compute, so only what exceeds the compute is exposed."""
    item, exposed, gathers = PRECISIONS[hardware.precision][1], 0.0, 0.0
    for n, psi in data_groups(model, layout):
        exposed += allreduce_cost("ring", n, int(psi * item), link.alpha, link.beta).time
        if layout.zero >= 3 and n > 1:
            blocks = model.layers / layout.pp
            gathers += blocks * (n - 1) * (link.alpha + psi * item / blocks / n * link.beta)
    return exposed + max(0.0, gathers - compute)


def step_ops(model: ModelSpec, layout: Layout, hardware: Hardware) -> dict[str, tuple[Op, ...]]:
    """One rank's ops: "layer" (one block, one micro-batch, forward and backward), "head" and "embeddings"
    (one micro-batch), "optimizer" (the step: the gradients' accumulation, the casts, AdamW)."""
    lay, gpu, fused = layout, hardware.gpu, hardware.fused
    dense, experts = params_per_rank(model, lay)
    sharded = dense / (lay.dp * lay.ep) + experts / lay.dp if lay.zero >= 1 else dense + experts
    return {"layer": layer_ops(model, gpu, lay.micro_batch, lay.tp, lay.cp, fused, hardware.attention,
                               lay.sequence_parallel),
            "head": head_ops(model, gpu, lay.micro_batch, lay.tp, lay.cp, fused),
            "embeddings": embedding_ops(model, gpu, lay.micro_batch, lay.cp, fused),
            "optimizer": optimizer_ops(gpu, dense + experts, sharded, lay.micro_batches(model),
                                       hardware.weights)}


def step_compute(model: ModelSpec, layout: Layout, hardware: Hardware) -> dict[str, float]:
    """Seconds of one rank's compute in a step: its L/pp blocks, recomputation, the head or the embeddings
    (the larger: the first or the last stage sets the pace; both on one stage without a pipeline) for M
    micro-batches, their gradients' accumulation, then the optimizer (the casts and AdamW)."""
    ops, lay = step_ops(model, layout, hardware), layout
    M, blocks = lay.micro_batches(model), model.layers / lay.pp
    again = [op for op in ops["layer"] if op.name.endswith("fwd")]
    if lay.recompute == "selective":
        again = [op for op in again if op.name.startswith("attention")]
    ends = [seconds(ops["head"]), seconds(ops["embeddings"])]
    out = {"layers": M * blocks * seconds(ops["layer"]),
           "recompute": M * blocks * seconds(again) if lay.recompute != "none" else 0.0,
           "head and embeddings": M * (sum(ends) if lay.pp == 1 else max(ends)),
           "gradient accumulation": seconds(ops["optimizer"][:1]),    # per micro-batch: in the bubble
           "optimizer": seconds(ops["optimizer"][1:])}
    out["total"] = sum(out.values())
    return out
