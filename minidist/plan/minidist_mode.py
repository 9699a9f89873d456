"""The planner's "minidist mode": what a layout costs on minidist's own cluster, to check against a run.

predict.py prices a real GPU job (16-bit Korthikanti activations, compute at the roofline's peak, nothing
overlapped). A run of ``Mesh`` + ``parallelize(..., overlap=False)`` (minidist/parallel/compose/: data ×
pipeline × context × tensor, any task table) is priced by other rules, and this module follows them so the
prediction can be compared with the simulated clock and the memory ledger of a run
(tests/plan/test_plan_minidist_mode.py). c: the context group, T' = T/c tokens per rank, t: the tensor
group, b sequences per micro-batch.

    compute    a unit's forward costs F_u = its FLOPs on (b, T') / device.flops (the layers' own ``flops``,
               which the clock charges too; a tensor block 1/t of them); backward 2·F_u, or F_u for a
               split Linear under ZB-H1 plus F_u in W. Pipeline charges compute and messages to one
               clock, one after the other, so they add up — except inside ring attention (below)
    messages   α + β·n on the sender's clock (n = b·T'·d·itemsize per activation or gradient); a receive
               ends at max(own clock, arrival): a rank waits, and that wait is the bubble
    schedule   the task table itself is walked in that event order (rank by rank, a task starting when
               its input arrived), so the bubble is the table's, not (P − 1)/(M + P − 1): that closed
               form assumes equal stages, and a tiny GPT's are not (the embeddings compute nothing,
               the blocks and the head most)
    tensor     a tensor-parallel block does 2 all-reduces of b·T'·d words in forward, 2 in backward
               (pairwise_allreduce, priced by minidist.sim.collective_cost)
    context    a block's attention is ring attention over c ranks: each of its c steps takes
               max(K|V transfer, the block's attention FLOPs / device.flops), backward one more
               transfer; after the table every gradient is a partial sum over the group (each rank saw
               its positions only): one pairwise_allreduce of the rank's Ψ words
    Chimera    the two holders of each stage exchange its gradients, parameter by parameter, when both
               are done (minidist_clock.replica_sum_seconds)
    expert     a Switch model's blocks over an expert group of e ranks (all-to-alls, the experts' rows,
               after the table the replicated parameters' pairwise_allreduce over the group):
               minidist_switch.py
    data       one ring all-reduce of the rank's gradients over D ranks, after everything else; with
               ZeRO-1 (zero=1: one bucket of all of them) a reduce-scatter and an allgather instead
               (collectives/primitives.py: the pairwise all-reduce's rounds), and AdamW's state of the
               rank's piece only: replica 0's, the largest of np.array_split's, is the one predicted
    memory     model states per rank: parameters, gradients and AdamW's m and v, each itemsize·Ψ_rank
               (float64 here: 32 bytes per parameter; predict.py's mixed precision is 16); a context group
               holds the same stages whole on each of its ranks, Chimera two stages per rank
    activations  per unit and micro-batch (N = b·T' tokens, itemsize i), what minidist's layers keep
               (nn.TransformerBlock stores the probabilities; the tensor-parallel block does not:
               tensor/transformer_cost.py; under ring attention it keeps no T'×T' mask either):
                 embeddings   8·b·T' + 8·T'            the token ids and positions (int64)
                 block        2(N·d + N)·i + (5N·d + b·a·T'²)·i + (N·d + 3N·f)·i   norms, attention, MLP
                 final norm   (N·d + N)·i;   head  N·d·i
               the last stage also keeps the loss gradient N·V·i until B; under ZB-H1 the split head
               keeps its input and that gradient from B until W. The table is walked adding F's bytes,
               freeing B's (and W's); the peak is the most held after any task, as Pipeline.memory
               samples it
"""

from __future__ import annotations

from minidist.cluster import Device, LinkModel
from minidist.collectives.pieces import split_sizes
from minidist.nn.checkpoint import forward_flops
from minidist.nn.linear import Linear
from minidist.parallel.data.buckets import DEFAULT_BUCKET_BYTES
from minidist.parallel.pipeline.boundaries import split_by_layers
from minidist.parallel.pipeline.schedule import Schedule, stage_ops
from minidist.parallel.tensor.transformer_cost import block_activation_bytes
from minidist.sim.collective_cost import collective_seconds

from .minidist_clock import replica_sum_seconds, ring_attention_seconds
from .minidist_switch import (
    check_switch,
    switch_block_activation_bytes,
    switch_block_arrays,
    switch_block_params,
    switch_block_seconds,
    switch_replicated_params,
)
from .model import ModelSpec

ADAMW_STATES = 2     # m and v, each the size of the parameter


def unit_params(spec: ModelSpec, tensor: int = 1, expert: int = 1) -> list[int]:
    """Parameters of each unit of ``nn.GPT.units`` (``split_for_mesh`` over t tensor ranks; a Switch model's
    blocks over e expert ranks: minidist_switch.py) on one rank: the embeddings (V·d + T·d), L blocks
    (attention 4d² + 4d, two LayerNorms 4d, MLP 2df + f + d; split over t: (4d² + 3d + 2df + f)/t + 6d,
    the proj and second MLP biases and the norms stay whole), the final LayerNorm (2d), the head (V·d, no
    bias). t must divide d, the heads and f."""
    d, f = spec.d_model, spec.ff
    if spec.heads % tensor or f % tensor:
        raise ValueError(f"tensor = {tensor} must divide heads = {spec.heads} and d_ff = {f}")
    first, last = spec.outside_params()
    split = (4 * d * d + 3 * d + 2 * d * f + f) // tensor + 6 * d
    block = spec.dense_block_params() if tensor == 1 else split
    if spec.moe:
        block = switch_block_params(spec, tensor, expert)
    return [first] + [block] * spec.layers + [2 * d, last - 2 * d]


def rank_stages(schedule: Schedule, rank: int) -> list[int]:
    return sorted({t.stage for t in stage_ops(schedule, rank)})


def predict_states(spec: ModelSpec, schedule: Schedule, num_stages: int, rank: int,
                   itemsize: int = 8, tensor: int = 1, expert: int = 1) -> dict[str, int]:
    """Bytes of model states on pipeline rank ``rank`` (one tensor rank of t): parameters, gradients,
    optimizer (AdamW), total."""
    bounds = split_by_layers(spec.layers + 3, num_stages)
    sizes = unit_params(spec, tensor, expert)
    psi = sum(sum(sizes[bounds[k]:bounds[k + 1]]) for k in rank_stages(schedule, rank))
    out = {"parameters": itemsize * psi, "gradients": itemsize * psi,
           "optimizer": ADAMW_STATES * itemsize * psi}
    out["total"] = sum(out.values())
    return out


Costs = list[tuple[float, float, float]]      # per unit: seconds of F, B, W on one micro-batch


def predict_step_seconds(schedule: Schedule, num_stages: int, unit_seconds: Costs,
                         send_seconds: float) -> list[float]:
    """Simulated seconds of the task table on each pipeline rank, walked in the cluster's event order.

    unit_seconds: per unit (in order), the seconds of its F, B and W on one micro-batch (W: 0 unless the
    table splits the unit's backward); a stage costs the sum of its units'. send_seconds: one activation
    (or gradient) between two ranks."""
    bounds = split_by_layers(len(unit_seconds), num_stages)
    cost = [[sum(unit_seconds[u][kind] for u in range(bounds[k], bounds[k + 1])) for k in range(num_stages)]
            for kind in range(3)]
    ranks = sorted({t.rank for tick in schedule for t in tick})
    rank_of = {(t.micro_batch, t.stage): t.rank for tick in schedule for t in tick}
    todo = {r: list(stage_ops(schedule, r)) for r in ranks}
    clock = dict.fromkeys(ranks, 0.0)
    arrival: dict[tuple, float] = {}          # (kind, micro_batch, receiving stage) -> arrival time
    while any(todo.values()):
        progressed = False
        for r in ranks:
            while todo[r]:
                _, kind, m, k = todo[r][0]
                needs = {"F": ("F", m, k) if k > 0 else None,
                         "B": ("B", m, k) if k < num_stages - 1 else None, "W": None}[kind]
                if needs is not None and needs not in arrival:
                    break                       # its input is not sent yet: another rank must go first
                if needs is not None and rank_of[m, k + (1 if kind == "B" else -1)] != r:
                    clock[r] = max(clock[r], arrival[needs])
                clock[r] += cost["FBW".index(kind)][k]
                target = {"F": k + 1, "B": k - 1, "W": -1}[kind]
                if 0 <= target < num_stages:
                    if rank_of[m, target] != r:
                        clock[r] += send_seconds
                    arrival[kind, m, target] = clock[r]
                todo[r].pop(0)
                progressed = True
        if not progressed:
            raise ValueError("the table deadlocks: no rank can run its next task")
    return [clock[r] for r in ranks]


def unit_activation_bytes(spec: ModelSpec, micro_batch: int, tensor: int = 1, rank: int = 0,
                          itemsize: int = 8, context: int = 1, expert: int = 1) -> list[int]:
    """Bytes each unit keeps for backward after one micro-batch's forward (tensor rank ``rank`` of t, T/c
    tokens of each sequence)."""
    b, T, d, i = micro_batch, spec.seq // context, spec.d_model, itemsize
    n = b * T
    if tensor == 1 and context == 1:
        block = (2 * (n * d + n) + 5 * n * d + b * spec.heads * T * T + n * d + 3 * n * spec.ff) * i
    else:
        block = block_activation_bytes(b, T, d, spec.heads, spec.ff, tensor, rank, i, False)["total"]
        block -= T * T if context > 1 else 0           # ring attention keeps no causal mask
    if spec.moe:
        block = switch_block_activation_bytes(spec, b, tensor, expert, i, context)
    return [8 * n + 8 * T] + [block] * spec.layers + [(n * d + n) * i, n * d * i]


def predict_activation_peak(spec: ModelSpec, schedule: Schedule, num_stages: int, rank: int,
                            micro_batch: int, tensor: int = 1, itemsize: int = 8, context: int = 1,
                            expert: int = 1) -> int:
    """Most bytes pipeline rank ``rank`` holds for backward after any of its tasks (module docstring)."""
    bounds = split_by_layers(spec.layers + 3, num_stages)
    units = unit_activation_bytes(spec, micro_batch, tensor, 0, itemsize, context, expert)
    stage = [sum(units[bounds[k]:bounds[k + 1]]) for k in range(num_stages)]
    dy = micro_batch * spec.seq // context * spec.vocab * itemsize         # the loss gradient, (b, T', V)
    stage[-1] += dy
    has_w = any(t.kind == "W" for tick in schedule for t in tick)
    waiting = [0] * num_stages                    # the head (the only top-level Linear): its input and dy
    if has_w:
        waiting[-1] = units[-1] + dy
    held = peak = 0
    for task in stage_ops(schedule, rank):
        k = task.stage
        held += {"F": stage[k], "B": waiting[k] - stage[k], "W": -waiting[k]}[task.kind]
        peak = max(peak, held)
    return peak


def unit_seconds(spec: ModelSpec, units, micro_batch: int, split: bool, tensor: int = 1, context: int = 1,
                 device: Device | None = None, link: LinkModel | None = None, expert: int = 1) -> Costs:
    """(F, B, W) seconds of each unit on one micro-batch (module docstring: compute, tensor, context)."""
    device, link = device or Device(), link or LinkModel()
    b, T, d = micro_batch, spec.seq // context, spec.d_model
    out = []
    for i, u in enumerate(units.layers):
        if spec.moe and 1 <= i <= spec.layers:
            forward, backward = switch_block_seconds(spec, u, b, tensor, expert, context, device, link)
            out.append((forward, backward, 0.0))
        elif 1 <= i <= spec.layers:               # a block: 1/t of its FLOPs, its collectives
            compute = forward_flops(u, (b, T, d)) // tensor / device.flops
            forward = backward = 2 * collective_seconds("pairwise", tensor, b * T * d, 8, link)
            if context > 1:
                ring = ring_attention_seconds(b, spec.seq, spec.heads // tensor, d // spec.heads, context,
                                              device.flops, link)
                forward, backward = forward + ring[0], backward + ring[1]
            out.append((compute + forward, 2 * compute + backward, 0.0))
        else:
            compute = forward_flops(u, (b, T) if i == 0 else (b, T, d)) / device.flops
            halves = split and isinstance(u, Linear)
            out.append((compute, compute if halves else 2 * compute, compute if halves else 0.0))
    return out


def predict_grid(spec: ModelSpec, units, schedule: Schedule, num_stages: int, num_micro_batches: int,
                 data: int = 1, tensor: int = 1, context: int = 1, device: Device | None = None,
                 link: LinkModel | None = None, expert: int = 1,
                 zero1: bool = False) -> list[dict[str, float]]:
    """Per pipeline rank of a float64 ``parallelize`` step (batch spec.batch, AdamW, overlap=False):
    "seconds", "states" (parameters + gradients + optimizer bytes), "activations" (peak) and "peak" (their
    sum). units: the whole GPT's units (``Sequential(*gpt.units())``: each unit's ``flops`` prices it; a
    tensor block does 1/t), or a SwitchTransformer's (spec.experts > 0, over ``expert`` ranks; spec.top_k
    must equal spec.experts).
    zero1: the optimizer sharded over the data group (module docstring: data)."""
    layers = list(units.layers)
    if len(layers) != spec.layers + 3:
        raise ValueError(f"units must be the {spec.layers + 3} units of a {spec.layers}-block GPT "
                         f"(nn.GPT.units), got {len(layers)} units")
    if spec.moe:
        check_switch(spec, expert)
    elif expert != 1:
        raise ValueError(f"a dense GPT has no experts to spread: expert must be 1, got {expert}")
    link = link or LinkModel()
    b = spec.batch // data // expert // num_micro_batches
    split = any(t.kind == "W" for tick in schedule for t in tick)
    seconds = predict_step_seconds(schedule, num_stages,
                                   unit_seconds(spec, units, b, split, tensor, context, device, link, expert),
                                   link.time(b * spec.seq // context * spec.d_model * 8))
    bounds = split_by_layers(len(layers), num_stages)
    sizes = unit_params(spec, tensor, expert)
    holders: dict[int, set[int]] = {}
    for tick in schedule:
        for t in tick:
            holders.setdefault(t.stage, set()).add(t.rank)
    out = []
    for r, clock in enumerate(seconds):
        mine = [u for k in rank_stages(schedule, r) for u in range(bounds[k], bounds[k + 1])]
        partners = {p for k in rank_stages(schedule, r) for p in holders[k] if p != r}
        if partners:                  # Chimera: both holders of a stage are done, then exchange (one pair)
            clock = max(clock, *(seconds[p] for p in partners))
            arrays = sum(switch_block_arrays(spec, expert) if spec.moe and 1 <= u <= spec.layers
                         else len(layers[u].parameters()) for u in mine)   # a tensor block: 1/t the size
            clock += replica_sum_seconds(arrays, sum(sizes[u] for u in mine), 8, link)
        states = predict_states(spec, schedule, num_stages, r, tensor=tensor, expert=expert)
        psi = states["parameters"] // 8
        clock += collective_seconds("pairwise", context, psi, 8, link)     # partial sums: every parameter
        if spec.moe:                                # partial sums: the replicated parameters over the experts
            outside = sum(sizes[u] for u in mine if not 1 <= u <= spec.layers)
            blocks = sum(1 <= u <= spec.layers for u in mine)
            replicated = outside + blocks * switch_replicated_params(spec, tensor, expert)
            clock += collective_seconds("pairwise", expert, replicated, 8, link)
        if zero1:              # one bucket: one reduce-scatter, one allgather; replica 0's shard the largest
            if 8 * psi >= DEFAULT_BUCKET_BYTES:
                raise ValueError(f"ZeRO-1 is priced for one bucket, got {8 * psi} bytes of gradients")
            states["optimizer"] = ADAMW_STATES * 8 * split_sizes(psi, data)[0]
            states["total"] = states["parameters"] + states["gradients"] + states["optimizer"]
            clock += collective_seconds("pairwise", data, psi, 8, link)
        else:
            clock += collective_seconds("ring", data, psi, 8, link)
        held = predict_activation_peak(spec, schedule, num_stages, r, b, tensor, context=context,
                                       expert=expert)
        out.append({"seconds": clock, "states": states["total"], "activations": held,
                    "peak": states["total"] + held})
    return out
