"""The planner's "minidist mode": what a layout costs on minidist's own cluster, to check against a run.

predict.py prices a real GPU job (16-bit Korthikanti activations, compute at the roofline's peak, nothing
overlapped). A run of ``DataPipelineGrid`` (minidist/parallel/grid_pipeline.py) is priced by other rules,
and this module follows them so the prediction can be compared with the simulated clock and the memory
ledger of a run (tests/plan/test_plan_minidist_mode.py):

    compute    a unit's forward costs F_u = its FLOPs / device.flops (the layers' own ``flops``, which
               the clock charges too); backward 2·F_u, or F_u for a split Linear under ZB-H1 plus F_u in
               W. Nothing overlaps: TaskPipeline charges compute and messages to one clock, one after the
               other (no ComputeClock(overlap=True) is attached), so the prediction has no overlap term
               either; where a clock does overlap (ring attention's transfers beside its blocks, data
               parallelism's buckets) this walk would over-count
    messages   α + β·n on the sender's clock (n = b·T·d·itemsize per activation or gradient); a receive
               ends at max(own clock, arrival): a rank waits, and that wait is the bubble
    schedule   the task table itself is walked in that event order (rank by rank, a task starting when
               its input arrived), so the bubble is the table's, not (P − 1)/(M + P − 1): that closed
               form assumes equal stages, and a tiny GPT's are not (the embeddings compute nothing,
               the blocks and the head most)
    tensor     a tensor-parallel block (t ranks) does 1/t of the block's FLOPs and 2 ring all-reduces of
               n = b·T·d·itemsize bytes in forward, 2 in backward, each 2(t − 1)(α + β·n/t) (tensor/comm.py's
               ring; the group's ranks run the same work, so nobody waits inside it)
    data       one ring all-reduce of the rank's gradient bytes over D ranks: 2(D − 1)(α + β·|W|/D) (exact
               when D divides the element count) — the data group's ranks sit at the same pipeline
               position, so they start it together
    memory     model states per rank: parameters, gradients and AdamW's m and v, each itemsize·Ψ_rank
               (float64 here: 32 bytes per parameter; predict.py's mixed precision is 16)
    activations  per unit and micro-batch of b sequences (N = b·T tokens, itemsize i), what minidist's
               layers keep (nn.TransformerBlock stores the probabilities; the tensor-parallel block does
               not: tensor/transformer_cost.py):
                 embeddings   8·b·T + 8·T              the token and position ids (int64)
                 block        2(N·d + N)·i + (5N·d + b·a·T²)·i + (N·d + 3N·f)·i   norms, attention, MLP
                 final norm   (N·d + N)·i;   head  N·d·i
               the last stage also keeps the loss gradient N·V·i until B; under ZB-H1 the split head
               keeps its input and that gradient from B until W. The table is walked adding F's bytes,
               freeing B's (and W's); the peak is the most held after any task, as TaskPipeline.memory
               samples it

Where it cannot match: Chimera sums its replicated stages' gradients parameter by parameter with
sendrecv (a message per parameter, priced by the pair's clocks), and a context group adds ring attention's
K/V messages inside the blocks and an all-reduce after; neither is priced here, so the check covers data ×
pipeline × tensor layouts under 1F1B, ZB-H1 and interleaved tables.
"""

from __future__ import annotations

from minidist.cluster import Device, LinkModel
from minidist.collectives.cost import allreduce_cost
from minidist.nn.checkpoint import forward_flops
from minidist.nn.linear import Linear
from minidist.parallel.pipeline.split import split_by_layers
from minidist.parallel.pipeline.tasks import TaskSchedule, rank_tasks
from minidist.parallel.tensor.transformer_cost import block_activation_bytes

from .model import ModelSpec

ADAMW_STATES = 2     # m and v, each the size of the parameter


def unit_params(spec: ModelSpec, tensor: int = 1) -> list[int]:
    """Parameters of each unit of ``gpt_units`` (``tensor_gpt_units`` over t ranks) on one rank: the
    embeddings (V·d + T·d), L blocks (attention 4d² + 4d, two LayerNorms 4d, MLP 2df + f + d; split
    over t: (4d² + 3d + 2df + f)/t + 6d, the proj and second MLP biases and the norms stay whole), the
    final LayerNorm (2d), the head (V·d, no bias). t must divide d, the heads and f."""
    d, f = spec.d_model, spec.ff
    if spec.heads % tensor or f % tensor:
        raise ValueError(f"tensor = {tensor} must divide heads = {spec.heads} and d_ff = {f}")
    first, last = spec.outside_params()
    split = (4 * d * d + 3 * d + 2 * d * f + f) // tensor + 6 * d
    block = spec.dense_block_params() if tensor == 1 else split
    return [first] + [block] * spec.layers + [2 * d, last - 2 * d]


def predict_states(spec: ModelSpec, schedule: TaskSchedule, num_stages: int, rank: int,
                   itemsize: int = 8, tensor: int = 1) -> dict[str, int]:
    """Bytes of model states on pipeline rank ``rank`` (one tensor rank of t): parameters, gradients,
    optimizer (AdamW), total."""
    bounds = split_by_layers(spec.layers + 3, num_stages)
    sizes = unit_params(spec, tensor)
    stages = sorted({t.stage for t in rank_tasks(schedule, rank)})
    psi = sum(sum(sizes[bounds[k]:bounds[k + 1]]) for k in stages)
    out = {"parameters": itemsize * psi, "gradients": itemsize * psi,
           "optimizer": ADAMW_STATES * itemsize * psi}
    out["total"] = sum(out.values())
    return out


def predict_step_seconds(schedule: TaskSchedule, num_stages: int, unit_flops: list[int], split: list[bool],
                         message_bytes: int, grad_bytes: list[int], data: int = 1,
                         unit_comm: list[float] | None = None,
                         device: Device | None = None, link: LinkModel | None = None) -> list[float]:
    """Simulated seconds of one step on each pipeline rank, walking the table in the cluster's event order.

    unit_flops: forward FLOPs of each unit for one micro-batch; split: which units ZB-H1 splits (the
    stage's top-level Linears, when the table has W tasks); message_bytes: one activation (or gradient)
    between stages; grad_bytes: the gradient bytes each pipeline rank all-reduces over ``data`` ranks;
    unit_comm: seconds of each unit's collectives in forward (backward has as many: ``tensor_seconds``)."""
    device, link = device or Device(), link or LinkModel()
    unit_comm = unit_comm or [0.0] * len(unit_flops)
    bounds = split_by_layers(len(unit_flops), num_stages)
    has_w = any(t.kind == "W" for tick in schedule for t in tick)
    fwd, bwd, wgt = [], [], []
    for k in range(num_stages):
        units = range(bounds[k], bounds[k + 1])
        comm = sum(unit_comm[u] for u in units)
        fwd.append(sum(unit_flops[u] for u in units) / device.flops + comm)
        bwd.append(sum((1 if has_w and split[u] else 2) * unit_flops[u] for u in units) / device.flops + comm)
        wgt.append(sum(unit_flops[u] for u in units if has_w and split[u]) / device.flops)
    ranks = sorted({t.rank for tick in schedule for t in tick})
    rank_of = {(t.micro_batch, t.stage): t.rank for tick in schedule for t in tick}
    todo = {r: list(rank_tasks(schedule, r)) for r in ranks}
    clock = dict.fromkeys(ranks, 0.0)
    arrival: dict[tuple, float] = {}          # (kind, micro_batch, receiving stage) -> arrival time
    send = link.alpha + link.beta * message_bytes
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
                clock[r] += {"F": fwd, "B": bwd, "W": wgt}[kind][k]
                target = {"F": k + 1, "B": k - 1, "W": -1}[kind]
                if 0 <= target < num_stages:
                    if rank_of[m, target] != r:
                        clock[r] += send
                    arrival[kind, m, target] = clock[r]
                todo[r].pop(0)
                progressed = True
        if not progressed:
            raise ValueError("the table deadlocks: no rank can run its next task")
    cost = [allreduce_cost("ring", data, grad_bytes[r], link.alpha, link.beta).time if data > 1 else 0.0
            for r in ranks]
    return [clock[r] + cost[r] for r in ranks]


def tensor_seconds(tokens: int, d_model: int, tensor: int, itemsize: int = 8,
                   link: LinkModel | None = None) -> float:
    """Seconds of a tensor-parallel block's forward collectives: 2 ring all-reduces of tokens·d words."""
    link = link or LinkModel()
    if tensor == 1:
        return 0.0
    return 2 * allreduce_cost("ring", tensor, tokens * d_model * itemsize, link.alpha, link.beta).time


def unit_activation_bytes(spec: ModelSpec, micro_batch: int, tensor: int = 1, rank: int = 0,
                          itemsize: int = 8) -> list[int]:
    """Bytes each unit keeps for backward after one micro-batch's forward (tensor rank ``rank`` of t)."""
    b, T, d, i = micro_batch, spec.seq, spec.d_model, itemsize
    n = b * T
    if tensor == 1:
        block = (2 * (n * d + n) + 5 * n * d + b * spec.heads * T * T + n * d + 3 * n * spec.ff) * i
    else:
        block = block_activation_bytes(b, T, d, spec.heads, spec.ff, tensor, rank, i, False)["total"]
    return [8 * n + 8 * T] + [block] * spec.layers + [(n * d + n) * i, n * d * i]


def predict_activation_peak(spec: ModelSpec, schedule: TaskSchedule, num_stages: int, rank: int,
                            micro_batch: int, tensor: int = 1, itemsize: int = 8) -> int:
    """Most bytes pipeline rank ``rank`` holds for backward after any of its tasks (module docstring)."""
    bounds = split_by_layers(spec.layers + 3, num_stages)
    units = unit_activation_bytes(spec, micro_batch, tensor, 0, itemsize)
    stage = [sum(units[bounds[k]:bounds[k + 1]]) for k in range(num_stages)]
    dy = micro_batch * spec.seq * spec.vocab * itemsize               # the loss gradient, (b, T, V)
    stage[-1] += dy
    has_w = any(t.kind == "W" for tick in schedule for t in tick)
    waiting = [0] * num_stages                    # the head (the only top-level Linear): its input and dy
    if has_w:
        waiting[-1] = units[-1] + dy
    held = peak = 0
    for task in rank_tasks(schedule, rank):
        k = task.stage
        held += {"F": stage[k], "B": waiting[k] - stage[k], "W": -waiting[k]}[task.kind]
        peak = max(peak, held)
    return peak


def predict_grid(spec: ModelSpec, units, schedule: TaskSchedule, num_stages: int, num_micro_batches: int,
                 data: int = 1, tensor: int = 1, device: Device | None = None,
                 link: LinkModel | None = None) -> list[dict[str, float]]:
    """Per pipeline rank of a float64 ``DataPipelineGrid`` step (batch spec.batch, AdamW): "seconds",
    "states" (parameters + gradients + optimizer bytes), "activations" (peak) and "peak" (their sum).
    units: the whole GPT's ``gpt_units`` (each unit's ``flops`` prices it; a tensor block does 1/t)."""
    layers = list(units.layers)
    if len(layers) != spec.layers + 3:
        raise ValueError(f"units must be gpt_units of a {spec.layers}-block GPT, got {len(layers)} units")
    b, T, d = spec.batch // data // num_micro_batches, spec.seq, spec.d_model
    blocks = range(1, 1 + spec.layers)
    flops = [forward_flops(u, (b, T) if i == 0 else (b, T, d)) // (tensor if i in blocks else 1)
             for i, u in enumerate(layers)]
    comm = [tensor_seconds(b * T, d, tensor, link=link) if i in blocks else 0.0 for i in range(len(layers))]
    pipe = len({t.rank for tick in schedule for t in tick})
    states = [predict_states(spec, schedule, num_stages, r, tensor=tensor) for r in range(pipe)]
    seconds = predict_step_seconds(schedule, num_stages, flops, [isinstance(u, Linear) for u in layers],
                                   b * T * d * 8, [s["gradients"] for s in states], data, unit_comm=comm,
                                   device=device, link=link)
    out = []
    for r in range(pipe):
        held = predict_activation_peak(spec, schedule, num_stages, r, b, tensor)
        total = states[r]["total"]
        out.append({"seconds": seconds[r], "states": total, "activations": held, "peak": total + held})
    return out
