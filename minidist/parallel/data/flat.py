"""Flat shard groups: the unit ZeRO (zero.py, zero_sync.py) cuts into P pieces.

A group is a list of Parameters seen as one flat vector of n = Σ sizes elements (a bucket for ZeRO-1/2,
a layer for ZeRO-3). Rank r owns the piece [lo, hi) = split_range(n, P, r) — the piece reduce_scatter
leaves on rank r and allgather collects from it (np.array_split's rule). The optimizer runs on one
``shard`` Parameter per group, of n_r = hi − lo elements: that is why the optimizer state shrinks by P.

Bytes rank r sends for one group of n elements of b bytes (collectives/primitives.py, pairwise
exchanges; n_r = split_sizes(n, P)[r]):

    reduce_scatter   b·(n − n_r)            every piece but its own, each to its owner
    allgather        b·(P − 1)·n_r          its own piece, to each of the P − 1 others
so with P | n each costs (P − 1)/P · b·n, as on the slides. ZeRO-1's step, ``zero1_shard_update``, ends it.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import allgather, reduce_scatter
from minidist.collectives.pieces import split_range, split_sizes
from minidist.nn.flat import flatten, views
from minidist.nn.module import Parameter
from minidist.optim import LARS


class ShardGroup:
    """params as one flat vector; this rank owns [lo, hi). ``data`` / ``grad``: the full flat arrays
    while they exist (None when freed); ``shard``: the Parameter of this rank's n_r elements."""

    def __init__(self, params: list[Parameter], rank: int, world_size: int):
        self.params = list(params)
        self.shapes = [p.shape for p in self.params]
        self.n = sum(p.size for p in self.params)
        self.dtype = self.params[0].data.dtype
        self.lo, self.hi = split_range(self.n, world_size, rank)
        self.data = flatten([p.data for p in self.params])
        self.grad: np.ndarray | None = None
        self.shard: Parameter | None = None

    def views(self, flat: np.ndarray) -> list[np.ndarray]:
        """flat (n,) cut into views of the parameters' shapes, in order."""
        return views(flat, self.shapes)

    def bind_data(self, flat: np.ndarray) -> None:
        """Make every parameter's .data a view of ``flat`` (n,) and keep it as ``data``."""
        self.data = flat
        for p, view in zip(self.params, self.views(flat)):
            p.data = view

    def bind_grad(self, flat: np.ndarray) -> None:
        """Make every parameter's .grad a view of ``flat`` (n,) (layers add into it in place)."""
        self.grad = flat
        for p, view in zip(self.params, self.views(flat)):
            p.grad = view

    def free_data(self) -> None:
        """Let go of the full parameters (ZeRO-3 between uses): data and every p.data become None."""
        self.data = None
        for p in self.params:
            p.data = None

    def free_grad(self) -> None:
        """Let go of the full gradient (ZeRO-2/3 after its reduce-scatter)."""
        self.grad = None
        for p in self.params:
            p.grad = None


def send_bytes(n: int, world_size: int, rank: int, itemsize: int, collective: str) -> int:
    """Bytes rank sends in one reduce_scatter or allgather of n elements (see the docstring)."""
    sizes = split_sizes(n, world_size)
    if collective == "reduce_scatter":
        return itemsize * (n - sizes[rank])
    if collective == "allgather":
        return itemsize * (world_size - 1) * sizes[rank]
    raise ValueError(f"collective must be 'reduce_scatter' or 'allgather', got {collective!r}")

def build_optimizer(make_optimizer, shards: list[Parameter]):
    """make_optimizer(shards), checked: an element-wise minidist optimizer over exactly the shards."""
    if not callable(make_optimizer) or hasattr(make_optimizer, "step"):
        raise TypeError("make_optimizer must be a function params -> optimizer (e.g. lambda ps: "
                        f"Adam(ps, lr=1e-3)), got {type(make_optimizer).__name__}: the optimizer is "
                        "built on this rank's shards")
    optimizer = make_optimizer(shards)
    for name in ("step", "zero_grad", "state_dict", "load_state_dict"):
        if not callable(getattr(optimizer, name, None)):
            raise TypeError(f"make_optimizer must return an optimizer with .{name}(), got "
                            f"{type(optimizer).__name__}")
    if isinstance(optimizer, LARS):
        raise TypeError("LARS scales each parameter by its whole norm; a shard cuts parameters, so "
                        "sharded data parallelism supports the element-wise optimizers "
                        "(SGD, Adam, AdamW, RMSprop, Adagrad)")
    if [id(p) for p in getattr(optimizer, "params", shards)] != [id(s) for s in shards]:
        raise ValueError("make_optimizer must build the optimizer on the parameters it is given "
                         "(the shards)")
    return optimizer


def zero1_shard_update(comm, groups: list[ShardGroup], optimizer) -> None:
    """ZeRO-1's step: reduce the gradients, update this rank's shards, share the updated shards.

    groups: each with ``grad`` (n,) this rank's full local gradient (weighted by n_r/B), ``data`` (n,) the
    full parameters, and ``shard`` a Parameter whose data and grad are views of data[lo:hi], grad[lo:hi].
    optimizer: built on [g.shard for g in groups]. Afterwards every rank's ``data`` holds the updated
    parameters, bitwise equal on all ranks.
    """
    # BEGIN SOLUTION zero1_shard_update
    # BEGIN PROMPT
    # Hint: for each group, reduce_scatter(comm, g.grad) returns piece r of the summed gradient: write it
    # into g.shard.grad (a view of g.grad[lo:hi]). One optimizer.step() updates every shard in place
    # (g.shard.data is a view of g.data). Then allgather(comm, g.shard.data) returns the P pieces in rank
    # order: write their concatenation into g.data.
    # END PROMPT
    for g in groups:
        g.shard.grad[...] = reduce_scatter(comm, g.grad)     # piece r of Σ_ranks grad
    optimizer.step()                                          # only this rank's piece: state is K·n_r
    for g in groups:
        g.data[...] = np.concatenate(allgather(comm, g.shard.data))
    # END SOLUTION
