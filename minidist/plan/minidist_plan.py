"""The planner's table in minidist mode: every layout of a small GPT on D simulated ranks, ranked by the step
time the cluster's clock will show, with the peak memory its ledger will count (``python -m minidist plan
--mode minidist``; ``--measure`` runs each layout one step and prints the measurement beside).

Why two modes. The analytic mode (predict.py) prices a real GPU job: 16 bytes per parameter in mixed
precision, Korthikanti's 16-bit activations, each op on a GPU's achieved roofs, the bubble's closed form —
numbers to compare with published runs, but nothing here can run them. This mode (minidist_mode.py)
prices what minidist's cluster does: float64 (32 bytes per parameter with AdamW), the activations its
layers keep, each unit's FLOPs at the simulated device's rate, the task table walked on the α-β clock,
every collective's rounds — and check.py finds it equal to runs of all 171 layouts of a tiny GPT on ≤ 8
ranks, and of every layout with an expert axis of a tiny Switch model (``--experts E --top-k E``: every
token to every expert, so the routing is known without running); ``--zero1`` shards AdamW over D.
ZeRO-2/3 are not in the table: a closing line gives ZeRO-3's bytes a step over all the ranks
(minidist_zero.py, equal to a run's), and says parallelize refuses ZeRO-2/3 with a pipeline axis.
A layout's row: the largest per-rank figure over its ranks (the slowest rank sets the step).

What it answers: a model it can build (float64 parameters and gradients, 16·Ψ bytes, once to predict,
once per rank to ``--measure``) within half the machine's physical memory and BUILD_LIMIT bytes (about
half a minute's building), at most the cluster's MAX_RANKS ranks, and task tables of n = M·stages
(micro-batch, stage) pairs with Σ n² at most WALK_LIMIT over the layouts (walking a table on the clock
costs about n² steps: 0.5-0.7 µs each on a loaded laptop, measured at B = 1024 on 8 and 64 ranks); a
larger size is refused in one line before anything is built (``check_size``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from minidist.cluster import Device, LinkModel
from minidist.cluster.launcher import MAX_RANKS
from minidist.nn import Sequential

from .check import GridLayout, build_model, measure, predict, runnable_layouts
from .minidist_zero import zero3_data_bytes
from .model import ModelSpec
from .units import format_bytes

WALK_LIMIT = 5 * 10**7     # Σ (M·stages)² over the layouts: about 30 s of table walks on a loaded laptop
BUILD_LIMIT = 8e9          # bytes of float64 parameters and gradients built at once (5·10^8 parameters)
MEASURE_LIMIT = 10**8      # --measure: ranks × layouts × Ψ parameters built and trained (on shared cores)


def physical_memory() -> int:
    """This machine's physical memory in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def check_size(spec: ModelSpec, devices: int, measured: bool = False) -> None:
    """ValueError, before anything is built, unless minidist mode can answer for spec on ``devices``
    ranks within a minute (module docstring): a layout of D ranks, if there is one, splits the batch into
    B / D micro-batches or more, so (B / D)² > WALK_LIMIT is refused before the layouts are listed."""
    copies = devices if measured else 1                    # --measure: every rank builds the whole model
    model_bytes, memory = 16 * spec.total_params() * copies, physical_memory()
    limit = min(BUILD_LIMIT, memory / 2) if memory else BUILD_LIMIT
    if devices > MAX_RANKS:
        raise ValueError(f"--devices {devices}: the simulated cluster runs at most {MAX_RANKS} ranks")
    if model_bytes > limit:
        where = f" on {copies} ranks" if measured else ""
        raise ValueError(f"minidist mode builds the model in float64{where}: {spec.total_params():,} "
                         f"parameters and their gradients need "
                         f"{format_bytes(model_bytes)}, more than the {format_bytes(limit)} it builds (the "
                         f"smaller of {format_bytes(BUILD_LIMIT)} and half this machine's memory)")
    if (spec.batch // devices) ** 2 > WALK_LIMIT:
        raise ValueError(f"--batch {spec.batch} on {devices} devices: a layout walks "
                         f"{spec.batch // devices:,} micro-batches or more, beyond minidist mode's limit")


@dataclass
class GridPlan:
    """One layout's prediction (largest over its ranks): seconds, states, activations, peak (bytes); and,
    when measured, the same from a run."""

    layout: GridLayout
    predicted: dict = field(default_factory=dict)
    measured: dict | None = None
    excluded: str | None = None


def worst(rows: list[dict]) -> dict:
    return {key: max(row[key] for row in rows) for key in rows[0]}


def plan_minidist(spec: ModelSpec, devices: int, device: Device | None = None, link: LinkModel | None = None,
                  measured: bool = False, zero1: bool = False) -> list[GridPlan]:
    """Every runnable layout of spec's GPT (or Switch model: an expert axis e > 1, minidist_switch.py;
    with ``zero1`` the layouts with D > 1, ZeRO-1 on) on exactly ``devices`` ranks (check.runnable_layouts),
    predicted in minidist mode (and run once each if ``measured``); those that fit device.memory first,
    fastest first, then the ones that do not fit."""
    check_size(spec, devices, measured)
    device, link = device or Device(), link or LinkModel()
    layouts = [lay for lay in runnable_layouts(spec, devices, zero1=zero1) if lay.world == devices]
    walk = sum((lay.micro_batches * lay.stages) ** 2 for lay in layouts)
    if walk > WALK_LIMIT:
        raise ValueError(f"{len(layouts)} layouts of {devices} ranks: their task tables cost {walk:,} steps "
                         f"to walk, more than minidist mode's {WALK_LIMIT:,} (a smaller --batch)")
    if measured and devices * len(layouts) * spec.total_params() > MEASURE_LIMIT:
        raise ValueError(f"--measure trains {len(layouts)} layouts of a {spec.total_params():,}-parameter "
                         f"model on {devices} ranks: more than the {MEASURE_LIMIT:,} parameter-steps it runs")
    units = Sequential(*build_model(spec).units()) if layouts else None      # one build for every layout
    plans = [GridPlan(lay, worst(predict(spec, lay, device, link, units))) for lay in layouts]
    for p in plans:
        if p.predicted["peak"] > device.memory:
            p.excluded = f"does not fit: {format_bytes(p.predicted['peak'])} > {format_bytes(device.memory)}"
    if measured:
        runs = measure(spec, layouts, device, link)
        for p in plans:
            p.measured = worst([{"seconds": s, "states": st, "activations": a, "peak": st + a}
                                for _, s, st, a in runs[p.layout]])
    return sorted(plans, key=lambda p: (p.excluded is not None, p.predicted["seconds"], p.predicted["peak"]))


def format_minidist_plan(spec: ModelSpec, plans: list[GridPlan], device: Device, link: LinkModel,
                         top: int = 10) -> str:
    """The table: layout, micro-batches, model states, activations and peak (kB) per rank, step (µs);
    measured step and peak beside when run."""
    runs = any(p.measured for p in plans)
    head = (f"{'layout':<34}{'M':>3}{'states kB':>11}{'activ kB':>10}{'peak kB':>10}{'step us':>10}"
            + (f"{'run: step us':>14}{'peak kB':>9}" if runs else ""))
    experts = f" with {spec.experts} experts (every token to each)" if spec.moe else ""
    lines = [f"minidist mode: {spec.total_params():,} parameters (float64, AdamW), {spec.layers} blocks"
             f"{experts}, d={spec.d_model}, T={spec.seq}, batch {spec.batch}; device {device.flops:.3g} "
             f"FLOP/s, link alpha {link.alpha:.3g} s, beta {link.beta:.3g} s/B", head, "-" * len(head)]
    fits = [p for p in plans if p.excluded is None]
    for p in fits[:top]:
        q = p.predicted
        row = (f"{p.layout.name():<34}{p.layout.micro_batches:>3}{q['states'] / 1e3:>11.2f}"
               f"{q['activations'] / 1e3:>10.2f}{q['peak'] / 1e3:>10.2f}{q['seconds'] * 1e6:>10.3f}")
        if p.measured:
            row += f"{p.measured['seconds'] * 1e6:>14.3f}{p.measured['peak'] / 1e3:>9.2f}"
        lines.append(row)
    if not plans:
        lines.append("no layout of this model runs on this many ranks (see minidist/plan/check.py)")
    lines.append(f"\n{len(fits)} layouts fit, {len(plans) - len(fits)} do not")
    lines += [f"  {p.layout.name():<34} {p.excluded}" for p in plans if p.excluded][:3]
    devices = plans[0].layout.world if plans else 1
    if devices > 1 and not spec.moe:
        sent = zero3_data_bytes(spec, devices, 0) / 1e3
        lines.append("ZeRO-2/3: not in this table (this mode prices ZeRO-3's bytes only; parallelize "
                     f"refuses ZeRO-2/3 with a pipeline axis); ZeRO-3 over all {devices} ranks sends "
                     f"{sent:.2f} kB a step from rank 0 (minidist_zero.py: 3Ψ, gathers again for each "
                     "further micro-batch)")
    return "\n".join(lines)
