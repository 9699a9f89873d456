"""Every check parallelize makes before it touches the model: a refused call leaves the model as it was.

Each refusal is a ValueError or TypeError saying what the engine supports instead. The limits that are not
plain argument checks come from the math: tied weights need the embedding and the head on one rank (no
pipeline axis) and one unit's gathers (no ZeRO-3); a Switch model's routing groups must be the mesh's;
a task table has at most one stage per unit; ZeRO-2/3 run without a pipeline axis (a stage accumulates its
micro-batches' gradients, which they would reduce-scatter and free after each backward); mixed precision
with zero=0 on one forward-backward pass per step (one cast of the weights, one unscale of the gradients).
"""

from __future__ import annotations

import inspect

import numpy as np

from minidist.nn import GPT, Dropout, MoE, Parameter, SwitchTransformer
from minidist.nn.checks import check_count
from minidist.precision.mixed import MixedPrecisionTrainer

from ..mesh import Mesh
from ..pipeline.registry import SYNCHRONOUS, make_schedule

MIXED_KEYWORDS = tuple(name for name in inspect.signature(MixedPrecisionTrainer).parameters
                       if name not in ("model", "optimizer", "loss_fn"))


def check_parallelize(model, mesh, *, loss_fn, optimizer, micro_batches, schedule, chunks, zero, mixed,
                      sequence_parallel, overlap, bucket_bytes):
    """Raise for what parallelize cannot train like one process (module docstring); returns the task
    table of the pipeline axis."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a minidist.parallel.Mesh, got {type(mesh).__name__}")
    check_model(model, mesh)
    sizes = mesh.sizes
    micro_batches = check_count(micro_batches, "micro_batches")
    if isinstance(model, SwitchTransformer):
        check_routing_groups(model, sizes, micro_batches)
    check_loss_and_optimizer(loss_fn, optimizer)
    if schedule not in SYNCHRONOUS:
        raise ValueError(f"schedule must be one of {sorted(SYNCHRONOUS)}, got {schedule!r}")
    if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3 (the ZeRO stage of the data axis), got {zero!r}")
    pipelined = sizes["pipeline"] > 1
    if zero >= 2 and pipelined:
        raise ValueError(f"ZeRO-{zero} runs without a pipeline axis (as DeepSpeed): a stage accumulates its "
                         f"micro-batches' gradients, which ZeRO-{zero} would reduce-scatter and free after "
                         f"each backward; use zero=1 with pipeline = {sizes['pipeline']}")
    if zero == 3 and model.tie_weights:
        raise ValueError("tied weights cannot stay tied under ZeRO-3: each unit's parameters are gathered "
                         "and freed as that unit's, and the token table is the embedding's and the head's; "
                         "use zero <= 2 or untie them")
    check_mixed(mixed, zero, pipelined, micro_batches)
    if mixed is not None and any(p.data.dtype != np.float32 for p in model.parameters()):
        raise TypeError(f"mixed precision keeps float32 master weights: build the model with "
                        f"dtype=np.float32, got {sorted({str(p.data.dtype) for p in model.parameters()})}")
    for name, flag in (("sequence_parallel", sequence_parallel), ("overlap", overlap)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    if sequence_parallel and (sizes["tensor"] == 1 or isinstance(model, SwitchTransformer)):
        raise ValueError("sequence_parallel needs a tensor axis > 1 and a dense GPT (an MoE's experts are "
                         "not split along the sequence)")
    if bucket_bytes is not None:
        check_count(bucket_bytes, "bucket_bytes")
    if not pipelined:
        return None
    options = {"chunks": check_count(chunks, "chunks", 2)} if schedule == "interleaved" else {}
    table = make_schedule(schedule, sizes["pipeline"], micro_batches, **options)
    stages, units = 1 + max(t.stage for tick in table for t in tick), model.n_layers + 3
    if stages > units:
        raise ValueError(f"the {schedule} table has {stages} stages but the model has {units} units "
                         f"(embeddings, {model.n_layers} blocks, ln_f, head): at most one stage per unit")
    return table


def check_model(model, mesh) -> None:
    if not isinstance(model, GPT):
        raise TypeError(f"model must be an nn.GPT or nn.SwitchTransformer, got {type(model).__name__}")
    sizes = mesh.sizes
    split = [type(m).__name__ for m in model.modules() if type(m).__module__.startswith("minidist.parallel")]
    if getattr(model, "already_split", False) or split:
        raise ValueError("the model is already split (by a Trainer or a transform: "
                         f"{', '.join(sorted(set(split))) or 'parallelize'}): build a fresh model for "
                         "each parallelize")
    dropouts = sorted({m.p for m in model.modules() if isinstance(m, Dropout) and m.p})
    if dropouts:
        raise ValueError(f"parallelize trains with dropout 0 only (the ranks would draw other masks than one "
                         f"process), got dropout {dropouts}")
    if model.tie_weights and sizes["pipeline"] > 1:
        raise ValueError("tied weights (head = token table) cannot stay tied over a pipeline axis: the "
                         "embedding and the head are on the first and the last stage; untie them or use "
                         "pipeline = 1")
    t = sizes["tensor"]
    heads, d_ff = model.blocks[0].attn.n_heads, model.blocks[0].d_ff
    if t > 1 and (heads % t or d_ff % t):
        raise ValueError(f"tensor = {t} must divide the heads ({heads}) and d_ff ({d_ff})")
    switch = isinstance(model, SwitchTransformer)
    if sizes["expert"] > 1 and not switch:
        raise ValueError(f"expert = {sizes['expert']} needs a SwitchTransformer, got a dense "
                         f"{type(model).__name__}")
    if switch and model.blocks[0].mlp.num_experts % sizes["expert"]:
        raise ValueError(f"{model.blocks[0].mlp.num_experts} experts cannot be spread evenly over expert = "
                         f"{sizes['expert']} ranks")


def check_routing_groups(model, sizes: dict, micro_batches: int) -> None:
    """A Switch model trains like one process only where each rank's micro-batch is one of its routing
    groups: without a context axis ``groups`` must be data × expert × micro_batches; with one, a group is a
    rank's zigzag positions, which no contiguous grouping matches, so routing must not depend on the group
    (nothing dropped: k·capacity_factor >= E, and no balance loss: aux_loss_coef = 0)."""
    moe: MoE = model.blocks[0].mlp
    parts = sizes["data"] * sizes["expert"] * micro_batches
    if sizes["context"] == 1 and moe.groups != parts:
        raise ValueError(f"the Switch model routes groups={moe.groups}, but the mesh routes data × expert × "
                         f"micro_batches = {parts} groups (one per rank and micro-batch): build it with "
                         f"groups={parts}")
    if sizes["context"] > 1 and (moe.aux_loss_coef or moe.k * moe.capacity_factor < moe.num_experts):
        raise ValueError("with a context axis a routing group is a rank's zigzag positions, which no "
                         "one-process grouping matches: a Switch model needs aux_loss_coef = 0 and "
                         f"k·capacity_factor >= num_experts (nothing dropped), got aux_loss_coef = "
                         f"{moe.aux_loss_coef}, k·capacity_factor = {moe.k * moe.capacity_factor}, "
                         f"num_experts = {moe.num_experts}")
    if getattr(moe, "second_expert", "always") != "always" and \
            sizes["data"] * sizes["expert"] * sizes["context"] > 1:
        raise ValueError("GShard's random second expert draws per token: ranks of other tokens would draw "
                         "other numbers than one process; use second_expert='always'")


def check_loss_and_optimizer(loss_fn, optimizer) -> None:
    if not (callable(getattr(loss_fn, "forward", None)) and callable(getattr(loss_fn, "backward", None))):
        raise TypeError(f"loss_fn must have forward(prediction, target) and backward() (e.g. "
                        f"CrossEntropyLoss()), got {loss_fn!r}")
    if not callable(optimizer):
        raise TypeError(f"optimizer must be a function of a list of Parameters returning an optimizer (e.g. "
                        f"lambda params: AdamW(params, lr=1e-3)), got {type(optimizer).__name__}")
    probe = optimizer([Parameter(np.zeros(1))])
    if not all(callable(getattr(probe, name, None)) for name in ("step", "zero_grad")):
        raise TypeError(f"optimizer(params) must return an optimizer (step(), zero_grad()), got "
                        f"{type(probe).__name__}")


def check_mixed(mixed, zero: int, pipelined: bool, micro_batches: int) -> None:
    if mixed is None:
        return
    if not isinstance(mixed, dict):
        raise ValueError(f"mixed must be a dict of MixedPrecisionTrainer's keywords (fmt=...), got {mixed!r}")
    unknown = sorted(set(mixed) - set(MIXED_KEYWORDS))
    if unknown or "fmt" not in mixed:
        raise ValueError(f"mixed takes MixedPrecisionTrainer's keywords {MIXED_KEYWORDS} (fmt required), "
                         f"got {sorted(mixed)}")
    if zero or pipelined or micro_batches != 1:
        raise ValueError(f"mixed precision runs with zero=0, without a pipeline axis and on one micro-batch "
                         f"(the recipe casts the weights for one forward-backward pass), got zero = {zero}, "
                         f"pipelined = {pipelined}, micro_batches = {micro_batches}")
