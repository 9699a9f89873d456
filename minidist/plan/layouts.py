"""The layouts the planner considers: data (with ZeRO) × expert × pipeline × tensor (+ sequence) × context.

Tensor parallelism comes with sequence parallelism by default (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models": the LayerNorms, dropouts and residual adds split over the
sequence); ``sequence_parallel=False`` is tensor parallelism as Megatron-LM ran it before that paper (and
as minidist's parallelize runs it by default): those regions replicated on every tensor rank.

A layout splits the devices D = dp · ep · pp · tp · cp. Placed on the cluster innermost first (Megatron's
order): tensor, then context, expert, data, pipeline — so the chattiest group (tensor: four collectives per
layer) is the one most likely to stay inside a node. The batch is split over dp · ep (the expert axis is
data parallel for everything but the experts, which it shards: the Switch slide's "expert + data" layout).

``check_layout`` says why a layout cannot run ("does not divide", or "refused by parallelize": ZeRO-2/3 with
a pipeline axis, which minidist's parallelize refuses as DeepSpeed does); the planner adds "does not fit".
Refused layouts are kept and marked, not left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from minidist.parallel.mesh import MeshShape
from minidist.parallel.pipeline.chimera import chimera_bubble
from minidist.parallel.pipeline.interleaved import interleaved_bubble
from minidist.parallel.pipeline.registry import PLANNED
from minidist.parallel.pipeline.zero_bubble import zero_bubble_bubble

from .model import RECOMPUTE, ModelSpec

AXES = ("dp", "ep", "pp", "tp", "cp")            # outermost-but-one ... as printed; placement order below
PLACEMENT = ("tp", "cp", "ep", "dp", "pp")        # innermost first


@dataclass(frozen=True)
class Layout:
    """Group sizes dp, ep, pp, tp, cp; ZeRO stage (0–3) over the data group; recomputation; the pipeline
    schedule (with v chunks per rank when interleaved); sequences per micro-batch; sequence_parallel: the
    tensor ranks split the LayerNorm, dropout and residual regions (else each holds and computes them
    whole)."""

    dp: int = 1
    ep: int = 1
    pp: int = 1
    tp: int = 1
    cp: int = 1
    zero: int = 0
    recompute: str = "none"
    schedule: str = "1f1b"
    chunks: int = 2
    micro_batch: int = 1
    sequence_parallel: bool = True

    @property
    def devices(self) -> int:
        return self.dp * self.ep * self.pp * self.tp * self.cp

    def micro_batches(self, model: ModelSpec) -> int:
        """M: micro-batches per step on one pipeline = batch / (dp · ep · micro_batch)."""
        return model.batch // (self.dp * self.ep * self.micro_batch)

    def bubble(self, model: ModelSpec) -> float:
        """The schedule's idle fraction (schedule tables' formulas; 1F1B and GPipe (P−1)/(M+P−1))."""
        P, M = self.pp, self.micro_batches(model)
        if P == 1:
            return 0.0
        if self.schedule == "interleaved":
            return interleaved_bubble(P, M, self.chunks)
        if self.schedule == "zb-h1":
            return zero_bubble_bubble(P, M)
        if self.schedule == "chimera":
            return chimera_bubble(P, M)
        return (P - 1) / (M + P - 1)

    def stride(self, axis: str) -> int:
        """Distance in ranks between neighbours of axis's groups (product of the inner axes' sizes)."""
        return MeshShape([(a, getattr(self, a)) for a in reversed(PLACEMENT)]).stride(axis)

    def name(self) -> str:
        sizes = " ".join(f"{a}{getattr(self, a)}" for a in AXES if getattr(self, a) > 1) or "single"
        return sizes + (" no-sp" if self.tp > 1 and not self.sequence_parallel else "")


def check_layout(model: ModelSpec, layout: Layout) -> str | None:
    """None if the layout can run the model, else why not (what does not divide)."""
    lay, m = layout, model
    rules = [
        (m.heads % lay.tp == 0, f"heads {m.heads} % tp {lay.tp}"),
        (m.ff % lay.tp == 0, f"d_ff {m.ff} % tp {lay.tp}"),
        (m.seq % (lay.cp * lay.tp) == 0, f"seq {m.seq} % (cp·tp) {lay.cp * lay.tp}"),
        (m.layers % (lay.pp * (lay.chunks if lay.schedule == "interleaved" else 1)) == 0,
         f"layers {m.layers} % pp {lay.pp}" + (f"·v {lay.chunks}" if lay.schedule == "interleaved" else "")),
        (lay.ep == 1 or (m.moe and m.experts % lay.ep == 0), f"experts {m.experts} % ep {lay.ep}"),
        (m.batch % (lay.dp * lay.ep * lay.micro_batch) == 0, f"batch {m.batch} % (dp·ep·micro-batch)"),
        (lay.zero == 0 or lay.dp * lay.ep > 1, "ZeRO needs a data group"),
    ]
    if lay.pp > 1 and lay.schedule in ("interleaved", "chimera"):
        M = lay.micro_batches(m) if m.batch % (lay.dp * lay.ep * lay.micro_batch) == 0 else 0
        rules.append((M % lay.pp == 0, f"micro-batches {M} % pp {lay.pp}"))
        rules.append((lay.schedule != "chimera" or lay.pp % 2 == 0,
                      f"Chimera needs an even pp, got {lay.pp}"))
    if lay.pp > 1 and lay.schedule == "zb-h1":
        M = lay.micro_batches(m) if m.batch % (lay.dp * lay.ep * lay.micro_batch) == 0 else 0
        rules.append((M >= lay.pp, f"ZB-H1 needs M {M} >= pp {lay.pp}"))
    failed = [reason for ok, reason in rules if not ok]
    if failed:
        return "does not divide: " + ", ".join(failed)
    if lay.zero >= 2 and lay.pp > 1:      # minidist/parallel/compose/refusals.py: as DeepSpeed
        return (f"refused by parallelize: ZeRO-{lay.zero} runs without a pipeline axis (a stage accumulates "
                "its micro-batches' gradients)")
    return None


def divisors(n: int) -> list[int]:
    """The divisors of n >= 1, ascending, by trial division up to √n (each k <= √n pairs with n // k)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


def enumerate_layouts(model: ModelSpec, devices: int, *, zero=(0, 1), recompute=RECOMPUTE,
                      schedule: str = "1f1b", chunks: int = 2, micro_batch: int = 1) -> list[Layout]:
    """Every layout with dp · ep · pp · tp · cp = devices (ep > 1 only for an MoE model), for each ZeRO
    stage and recomputation given; ZeRO > 0 only with a data group."""
    if schedule not in PLANNED:
        raise ValueError(f"schedule must be one of {PLANNED}, got {schedule!r}")
    for r in recompute:
        if r not in RECOMPUTE:
            raise ValueError(f"recompute must be among {RECOMPUTE}, got {r!r}")
    for z in zero:
        if z not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stages are 0, 1, 2, 3, got {z!r}")
    layouts = []
    for tp, cp, ep, pp in product(divisors(devices), repeat=4):
        if devices % (tp * cp * ep * pp) or (ep > 1 and not model.moe):
            continue
        dp = devices // (tp * cp * ep * pp)
        for z, r in product(zero, recompute):
            if z and dp * ep == 1:
                continue
            layouts.append(Layout(dp, ep, pp, tp, cp, z, r, schedule, chunks, micro_batch))
    return layouts
