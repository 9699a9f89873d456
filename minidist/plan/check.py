"""The planner's minidist mode checked against the cluster: every layout of a tiny GPT that runs on ≤ 8 ranks.

A layout (``Mesh`` + ``parallelize``, minidist/parallel/compose/) is D data replicas × P pipeline ranks × c
context ranks × t tensor ranks (D·P·c·t ≤ 8) with a task table: 1F1B (P stages), interleaved 1F1B (v = 2
chunks per rank: 2P stages), ZB-H1 or Chimera, on M micro-batches. What runs here is what divides: the GPT's L
+ 3 units into the stages, its heads and d_ff by t, its T tokens into the 2c zigzag pieces, its batch N into D
replicas of M equal micro-batches, M any count the table accepts (1F1B, ZB-H1: M ≥ P; interleaved, Chimera: a
multiple of P). ``runnable_layouts`` lists them; ``measure`` runs one AdamW step of each and returns, per
rank, its pipeline position, the simulated seconds of the step, the model states the ledger counts
(``held_bytes``) and the most activation bytes held for backward (``Trainer.peak_activation_bytes``: the
executor's after any task, or one pipeline rank's runner after any forward). Each layout trains with
``overlap=False``: the data group's reduction after the step's backward, as predict_grid prices it. Layouts of
one world size run in one ``run`` (a barrier before each step puts every clock level).

A spec with experts is a Switch model (``build_switch``: every token to every expert, so its routing is
known without running, minidist_switch.py) and its layouts all have an expert axis e > 1 dividing E, the
batch split into D·e token sets of M micro-batches each.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from minidist.cluster import Device, LinkModel, run
from minidist.nn import GPT, CrossEntropyLoss, Sequential, SwitchTransformer
from minidist.optim import AdamW
from minidist.parallel import Mesh, parallelize
from minidist.parallel.mesh import MeshShape
from minidist.parallel.pipeline.registry import PLANNED, make_schedule
from minidist.parallel.pipeline.schedule import Schedule
from minidist.sim.memory import held_bytes

from .minidist_mode import predict_grid
from .model import ModelSpec

CHUNKS = 2        # interleaved: virtual stages per rank


@dataclass(frozen=True)
class GridLayout:
    """D·P·c·t·e ranks running ``schedule`` ("1f1b", "interleaved", "zb-h1", "chimera") on M micro-batches;
    e > 1 only for a Switch model; zero1: AdamW sharded over the D data ranks (ZeRO-1)."""

    data: int
    pipe: int
    context: int
    tensor: int
    schedule: str
    micro_batches: int
    expert: int = 1
    zero1: bool = False

    @property
    def shape(self) -> MeshShape:
        """The layout's mesh sizes, in the mesh's rank order (parallel/mesh.py)."""
        return MeshShape(dict(data=self.data, pipeline=self.pipe, context=self.context, expert=self.expert,
                              tensor=self.tensor))

    @property
    def world(self) -> int:
        return self.shape.world_size

    @property
    def stages(self) -> int:
        return CHUNKS * self.pipe if self.schedule == "interleaved" else self.pipe

    def table(self) -> Schedule:
        return make_schedule(self.schedule, self.pipe, self.micro_batches, chunks=CHUNKS)

    def name(self) -> str:
        sizes = " ".join(f"{a}{n}" for a, n in (("dp", self.data), ("pp", self.pipe), ("cp", self.context),
                                               ("tp", self.tensor), ("ep", self.expert)) if n > 1) or "single"
        return sizes + ("" if self.pipe == 1 else f" {self.schedule}") + (" zero1" if self.zero1 else "")


@functools.lru_cache(maxsize=64)
def divisors(n: int) -> list[int]:
    """The divisors of n >= 1, ascending (trial division up to √n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def runnable_layouts(spec: ModelSpec, max_ranks: int = 8,
                     fewest_micro_batches: bool = False, zero1: bool = False) -> list[GridLayout]:
    """Every layout of spec's GPT on at most max_ranks ranks (module docstring), smallest world first; with
    ``fewest_micro_batches`` only the smallest M of each; with ``zero1`` those with D > 1, ZeRO-1 on."""
    units = spec.layers + 3
    experts = [e for e in range(2, spec.experts + 1) if spec.experts % e == 0] if spec.moe else [1]
    out = []
    layouts = ((d, e) for d in range(1, max_ranks + 1) for e in experts if spec.batch % (d * e) == 0)
    for data, expert in layouts:
        for pipe in range(1, min(units, max_ranks // data) + 1):
            for context in (c for c in range(1, max_ranks + 1) if spec.seq % (2 * c) == 0 or c == 1):
                for tensor in (t for t in range(1, max_ranks + 1) if spec.heads % t == spec.ff % t == 0):
                    if data * pipe * context * tensor * expert > max_ranks:
                        continue
                    for schedule in PLANNED if pipe > 1 else ("1f1b",):
                        if (schedule == "interleaved" and CHUNKS * pipe > units) or \
                                (schedule == "chimera" and pipe % 2):
                            continue
                        step = pipe if schedule in ("interleaved", "chimera") else 1
                        rows = spec.batch // data // expert
                        counts = [m for m in divisors(rows) if m >= pipe and m % step == 0]
                        out += [GridLayout(data, pipe, context, tensor, schedule, m, expert)
                                for m in counts[:1 if fewest_micro_batches else None]]
    if zero1:
        out = [replace(lay, zero1=True) for lay in out if lay.data > 1]
    return sorted(out, key=lambda lay: lay.world)


def build_gpt(spec: ModelSpec, seed: int = 3, dtype=np.float64) -> GPT:
    if spec.d_model * 4 != spec.ff or spec.moe:
        raise ValueError("the check trains nn.GPT: a dense model with d_ff = 4·d_model")
    return GPT(spec.vocab, spec.seq, spec.layers, spec.d_model, spec.heads, rng=np.random.default_rng(seed),
               dtype=dtype)


def build_switch(spec: ModelSpec, seed: int = 3, dtype=np.float64, groups: int = 1) -> SwitchTransformer:
    """spec's Switch model routing every token to every expert (k = E, capacity factor E: nothing
    dropped), so what the all-to-alls carry is known without running (minidist_switch.py); the z-loss
    only (routing that depends on no group, so any mesh may train it), ``groups`` routing groups."""
    if spec.top_k != spec.experts:
        raise ValueError(f"the check's Switch model routes every token to every expert: top_k = experts, "
                         f"got top_k = {spec.top_k}, experts = {spec.experts}")
    return SwitchTransformer(spec.vocab, spec.seq, spec.layers, spec.d_model, spec.heads, spec.experts,
                             spec.ff, k=spec.top_k, capacity_factor=float(spec.experts), aux_loss_coef=0.0,
                             z_loss_coef=0.001, groups=groups, rng=np.random.default_rng(seed), dtype=dtype)


def build_model(spec: ModelSpec, seed: int = 3, dtype=np.float64, groups: int = 1) -> GPT:
    return build_switch(spec, seed, dtype, groups) if spec.moe else build_gpt(spec, seed, dtype)


def predict(spec: ModelSpec, layout: GridLayout, device: Device | None = None,
            link: LinkModel | None = None, units: Sequential | None = None) -> list[dict[str, float]]:
    """predict_grid for the layout: per pipeline rank seconds, states, activations, peak. units: spec's
    model as ``Sequential(*model.units())`` (built here if None; only its shapes and FLOPs are read, so one
    build serves every layout)."""
    units = Sequential(*build_model(spec).units()) if units is None else units
    return predict_grid(spec, units, layout.table(), layout.stages,
                        layout.micro_batches, layout.data, layout.tensor, layout.context, device=device,
                        link=link, expert=layout.expert, zero1=layout.zero1)


def _measure_many(comm, spec: ModelSpec, layouts: list[GridLayout], tokens: np.ndarray) -> list[tuple]:
    out = []
    for lay in layouts:
        groups = lay.data * lay.expert * lay.micro_batches if lay.context == 1 else 1   # the mesh's
        mesh = Mesh(comm, **lay.shape.sizes)
        trainer = parallelize(build_model(spec, groups=groups), mesh, loss_fn=CrossEntropyLoss(),
                              optimizer=lambda params: AdamW(params, lr=0.01),
                              micro_batches=lay.micro_batches,
                              schedule=lay.schedule, chunks=CHUNKS, zero=int(lay.zero1), overlap=False)
        trainer.prepare(spec.seq)
        comm.barrier()
        start = comm.clock
        trainer.local_step(tokens[0], tokens[1])         # the step, without the loss's gather
        held = held_bytes(parameters=trainer.held, optimizer=trainer.optimizer)
        states = held["parameters"] + held["gradients"] + held["optimizer"]
        out.append((trainer.position, comm.clock - start, states, trainer.peak_activation_bytes))
    return out


def measure(spec: ModelSpec, layouts: list[GridLayout], device: Device | None = None,
            link: LinkModel | None = None, seed: int = 9, timeout: float = 300) -> dict[GridLayout, list]:
    """One AdamW step of each layout on the cluster: per rank (position, seconds, states bytes, activation
    peak bytes), rank by rank."""
    tokens = np.random.default_rng(seed).integers(0, spec.vocab, size=(2, spec.batch, spec.seq))
    results = {}
    for world in sorted({lay.world for lay in layouts}):
        group = [lay for lay in layouts if lay.world == world]
        ranks = run(_measure_many, world, spec, group, tokens, device=device, link=link, timeout=timeout)
        for i, lay in enumerate(group):
            results[lay] = [per_rank[i] for per_rank in ranks]
    return results


def compare(spec: ModelSpec, layouts: list[GridLayout], device: Device | None = None,
            link: LinkModel | None = None) -> dict[GridLayout, list[tuple[float, float, int, int]]]:
    """measure and predict each layout: per rank (predicted seconds, measured seconds, predicted peak bytes,
    measured peak bytes: the model states plus the most activation bytes held), rank by rank."""
    measured = measure(spec, layouts, device, link)
    out = {}
    for lay in layouts:
        predicted = predict(spec, lay, device, link)
        out[lay] = [(predicted[p]["seconds"], seconds, predicted[p]["peak"], states + held)
                    for p, seconds, states, held in measured[lay]]
    return out
