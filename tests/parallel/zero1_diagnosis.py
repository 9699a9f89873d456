"""Diagnosing zero1_shard_update (ZeRO-1's step) in its own terms: after the reduce-scatter, which rank's
shard of which group holds whose gradient; after the allgather, which rank's parameters lack which
rank's updated piece.

Rank r's gradient of group k holds, at flat element j, (64·k + j + 1)·2^P + 2^r: a sum over a set S of
ranks reads back as a mask of S (the value mod 2^P) and (64·k + j + 1)·|S|. The optimizer is a recorder
that keeps what each shard's grad holds when step() runs and then steps w ← w − grad (exact on these
integers); every parameter starts at 0, so −w after the allgather reads the same way.
"""

import numpy as np

import minidist.parallel.data.flat as flat
from minidist.cluster import ClusterError, run
from minidist.nn.module import Parameter

GROUPS = (((2, 3), (1,)), ((4,),))          # n = 7 and 4: not divisible by 2 or 3


class RecordingSGD:
    """w ← w − grad on the shards; ``seen``: what each shard's grad held at each step()."""

    def __init__(self, shards):
        self.shards, self.seen = shards, []

    def step(self):
        self.seen.append([np.array(s.grad, dtype=np.float64) for s in self.shards])
        for s in self.shards:
            s.data -= s.grad


def marked_grad(rank: int, p: int, k: int, n: int) -> np.ndarray:
    return (64 * k + np.arange(n) + 1) * 2.0**p + 2.0**rank


def zero1_trace(comm):
    """This rank's groups after zero1_shard_update: what its optimizer saw, its flat data, its parameters."""
    groups = []
    for k, shapes in enumerate(GROUPS):
        g = flat.ShardGroup([Parameter(np.zeros(s)) for s in shapes], comm.rank, comm.world_size)
        g.bind_data(g.data)
        g.bind_grad(marked_grad(comm.rank, comm.world_size, k, g.n))
        g.shard = Parameter(g.data[g.lo:g.hi])
        g.shard.grad = g.grad[g.lo:g.hi]
        groups.append(g)
    optimizer = RecordingSGD([g.shard for g in groups])
    flat.zero1_shard_update(comm, groups, optimizer)     # looked up now: a planted one reaches the ranks
    shard_views = [np.shares_memory(g.shard.grad, g.grad) for g in groups]
    return (optimizer.seen, [np.array(g.data) for g in groups],
            [np.concatenate([q.data.ravel() for q in g.params]) for g in groups], shard_views)


def _reads(value: float, world: int) -> str:
    v = int(value)
    ranks = [q for q in range(world) if v >> q & 1]
    if v != value or v < 0 or not ranks or (v >> world) % len(ranks):
        return f"{value:g}"
    index = (v >> world) // len(ranks) - 1
    return f"the sum over ranks {ranks} of group {index // 64}'s element {index % 64}"


def _first_off(got: np.ndarray, want: np.ndarray) -> int | None:
    if got.shape != want.shape:
        return -1
    off = np.flatnonzero(got != want)
    return int(off[0]) if off.size else None


def diagnose_zero1(world: int) -> str | None:
    """The first shard, rank and element zero1_shard_update gets wrong, phase by phase."""
    sizes = [sum(int(np.prod(s)) for s in g) for g in GROUPS]
    what = f"zero1_shard_update over {world} rank{'s' * (world > 1)}, groups of {sizes} elements"
    try:
        traces = run(zero1_trace, world, timeout=30)
    except ClusterError as err:
        return f"{what}: the run failed: {err}"
    everyone = list(range(world))
    for r, (seen, data, params, shard_views) in enumerate(traces):
        if len(seen) != 1:
            return f"{what}: rank {r} called optimizer.step() {len(seen)} times; ZeRO-1 steps once"
        for k, got in enumerate(seen[0]):
            n = sizes[k]
            lo, hi = flat.split_range(n, world, r)
            total = sum(marked_grad(q, world, k, n) for q in everyone)[lo:hi]
            i = _first_off(got, total)
            if i == -1:
                return (f"{what}: after the reduce-scatter, rank {r}'s shard of group {k} should hold piece "
                        f"{r} of the summed gradient, elements [{lo}, {hi}); its grad has shape {got.shape}")
            if i is not None:
                return (f"{what}: after the reduce-scatter, rank {r}'s shard of group {k}, element {lo + i} "
                        f"(shard index {i}), should be the sum over ranks {everyone} of group {k}'s element "
                        f"{lo + i}; when the optimizer stepped it held {_reads(got[i], world)}")
            if not shard_views[k]:
                return (f"{what}: rank {r}'s shard of group {k}: write piece {r} INTO shard.grad (a view of "
                        f"the group's grad[{lo}:{hi}]), do not rebind it")
        for k, (got, views) in enumerate(zip(data, params, strict=True)):
            n = got.size
            total = sum(marked_grad(q, world, k, n) for q in everyone)
            for name, array in (("flat data", got), ("parameters (views of the flat data)", views)):
                i = _first_off(array, -total)
                if i == -1:
                    return (f"{what}: after the allgather, rank {r}'s {name} of group {k} should have "
                            f"{total.size} elements; it has shape {array.shape}")
                if i is not None:
                    held = "0, the value before the step: never updated" if array[i] == 0 else \
                        f"−({_reads(-array[i], world)})"
                    owner = next(q for q in everyone if flat.split_range(n, world, q)[1] > i)
                    return (f"{what}: after the allgather, rank {r}'s {name} of group {k}, element {i} (in "
                            f"rank {owner}'s piece) should be 0 − the sum over ranks {everyone} of its "
                            f"gradient; it holds {held}")
    return None
