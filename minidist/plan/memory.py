"""Per rank memory at the step's peak moment, physical: from shapes and dtypes, nothing fitted per shape.

States (the ZeRO paper, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"): Ψ
parameters per rank (predict.params_per_rank) cost, per parameter, in bytes

    weights "bf16"      Megatron-style mixed precision: 16-bit weights 2, 16-bit gradients 2, FP32 master,
    (the default)       m and v 12; the weights are cast from the masters once per step, after the update
    weights "autocast"  PyTorch autocast over FP32 parameters: weights 4 (they are the masters), FP32
                        gradients 4, Adam's m and v 8, plus a 16-bit copy of every weight (2) made at each
                        micro-batch's forward and kept for its backward
    precision "fp32"    4 + 4 + 8, no copies

ZeRO-1 divides the optimizer state by the data group, ZeRO-2 the gradients too, ZeRO-3 the weights too (its
rank then holds two layers' gathered 16-bit weights: the one computing and the one prefetched).

Activations: Korthikanti's bytes per layer (model.py; FlashAttention keeps its output and log-sum-exp,
``attention="eager"`` the s² scores too) × L/pp layers × the micro-batches the first stage holds: min(M,
pp) under 1F1B and ZB-H1 (pp under Chimera), × (1 + (pp − 1)/(pp·v)) interleaved; 1 without a pipeline;
full recomputation adds one layer's activations, recomputed.

The loss, at the vocabulary's size, per logit of one micro-batch on the last stage (V / tp per rank):
16-bit logits 2, the FP32 copy cross-entropy takes 4, its log-probabilities 4 (FP32 training: 4 + 4).

The allocator's peak is the largest moment of the step, not the sum of everything ever held:

    loss moment       the last micro-batch's loss: weights, optimizer state, gradients (held all step with
                      16-bit weights; with autocast only while micro-batches accumulate, M > 1: PyTorch's
                      zero_grad frees them), 16-bit copies, every activation held, the loss's tensors
    optimizer moment  the update: weights, gradients, optimizer state (activations and copies are freed)

With a pipeline the first stage holds the most activations and the last the loss: both are priced.
"""

from __future__ import annotations

from .layouts import Layout
from .model import ModelSpec

WEIGHTS = ("bf16", "autocast")
PRECISIONS = {"mixed": (2, 2, 12, 2), "fp32": (4, 4, 8, 4)}   # parameter, gradient, optimizer; activation


def params_per_rank(model: ModelSpec, layout: Layout) -> tuple[float, float]:
    """(Ψ of the dense part, Ψ of the experts) held by one rank of the largest stage."""
    per_stage = model.layers / layout.pp
    first, last = model.outside_params()
    outside = first + last if layout.pp == 1 else max(first, last)
    dense = (per_stage * model.dense_block_params() + outside) / layout.tp
    experts = per_stage * model.expert_params() / (layout.ep * layout.tp)
    copies = 2 if layout.schedule == "chimera" and layout.pp > 1 else 1
    return copies * dense, copies * experts


def state_bytes(precision: str, weights: str) -> tuple[int, int, int, int]:
    """Bytes per parameter of (weights, gradients, optimizer state, its 16-bit copy)."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    if precision == "fp32":
        return 4, 4, 8, 0
    return (2, 2, 12, 0) if weights == "bf16" else (4, 4, 8, 2)


def loss_bytes_per_logit(precision: str) -> int:
    """The loss's tensors per logit: 16-bit logits, cross-entropy's FP32 copy, its log-probabilities."""
    return 8 if precision == "fp32" else 2 + 4 + 4


def predict_memory(model: ModelSpec, layout: Layout, precision: str = "mixed", attention: str = "flash",
                   weights: str = "bf16") -> dict[str, float]:
    """Bytes per rank: parameters, gradients, optimizer, weight copies, activations, logits (as held at
    the peak moment), the two moments' totals ("loss moment", "optimizer moment") and total, their max."""
    per_param, per_grad, per_opt, per_copy = state_bytes(precision, weights)
    act_item = PRECISIONS[precision][3]
    dense, experts = params_per_rank(model, layout)
    data, expert_data = layout.dp * layout.ep, layout.dp

    def states(per: int, sharded: bool) -> float:
        return per * (dense / data + experts / expert_data if sharded else dense + experts)

    out = {"parameters": states(per_param, layout.zero >= 3), "gradients": states(per_grad, layout.zero >= 2),
           "optimizer": states(per_opt, layout.zero >= 1)}
    M, P = layout.micro_batches(model), layout.pp
    gathered = 2 * 2 * (model.dense_block_params() + model.expert_params()) / layout.tp
    out["weight copies"] = gathered if layout.zero >= 3 else per_copy * (dense + experts)
    per_layer = model.activation_bytes(layout.micro_batch, layout.tp, layout.cp, layout.recompute, attention,
                                       layout.sequence_parallel)
    per_layer *= act_item / 2
    held = 1.0 if P == 1 else (P if layout.schedule == "chimera" else min(M, P))
    if layout.schedule == "interleaved" and P > 1:
        held *= 1 + (P - 1) / (P * layout.chunks)
    again = 0.0
    if layout.recompute == "full":   # one layer's activations exist again while it is recomputed
        again = model.activation_bytes(layout.micro_batch, layout.tp, layout.cp, "none", attention,
                                       layout.sequence_parallel)
        again *= act_item / 2
    logits = (loss_bytes_per_logit(precision) * layout.micro_batch * model.seq / layout.cp
              * model.vocab / layout.tp)
    first = held * model.layers / P * per_layer + again        # the stage holding the most micro-batches
    last = model.layers / P * per_layer + again                 # the last: one at a time, and the loss
    if P > 1 and first > last + logits:
        out["activations"], out["logits"] = first, 0.0
    else:
        out["activations"], out["logits"] = last, logits
    grads_at_loss = out["gradients"] if (weights == "bf16" or precision == "fp32" or M > 1) else 0.0
    out["loss moment"] = (out["parameters"] + out["optimizer"] + grads_at_loss + out["weight copies"]
                          + out["activations"] + out["logits"])
    out["optimizer moment"] = out["parameters"] + out["gradients"] + out["optimizer"]
    out["total"] = max(out["loss moment"], out["optimizer moment"])
    return out


def peak_breakdown(memory: dict[str, float], weights: str = "bf16", precision: str = "mixed",
                   micro_batches: int = 1) -> list[tuple[str, float]]:
    """The parts held at the peak moment (predict_memory's dict), largest moment first, as (name, bytes)."""
    if memory["loss moment"] >= memory["optimizer moment"]:
        held = ["parameters", "optimizer", "weight copies", "activations", "logits"]
        if weights == "bf16" or precision == "fp32" or micro_batches > 1:
            held.insert(1, "gradients")
        return [("loss moment", memory["loss moment"])] + [(k, memory[k]) for k in held]
    return [("optimizer moment", memory["optimizer moment"])] + [
        (k, memory[k]) for k in ("parameters", "gradients", "optimizer")]
