"""Flat shard groups: what ZeRO (zero.py) and FSDP (fsdp.py) share.

A group is a list of Parameters seen as one flat vector of n = Σ sizes elements (a bucket for ZeRO-1/2,
a layer for ZeRO-3). Rank r owns the piece [lo, hi) = split_range(n, P, r) — the piece reduce_scatter
leaves on rank r and allgather collects from it (np.array_split's rule). The optimizer runs on one
``shard`` Parameter per group, of n_r = hi − lo elements: that is why the optimizer state shrinks by P.

Bytes rank r sends for one group of n elements of b bytes (collectives/primitives.py, pairwise
exchanges; n_r = split_sizes(n, P)[r]):

    reduce_scatter   b·(n − n_r)            every piece but its own, each to its owner
    allgather        b·(P − 1)·n_r          its own piece, to each of the P − 1 others
so with P | n each costs (P − 1)/P · b·n, as on the slides.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import ALGORITHMS
from minidist.nn.flat import flatten, views
from minidist.nn.module import Module, Parameter
from minidist.optim import LARS
from minidist.split import split_range, split_sizes

from .replicas import check_same_layout, check_same_values
from .shards import leaf_layers


class ShardGroup:
    """params as one flat vector; this rank owns [lo, hi). ``data`` / ``grad``: the full flat arrays
    while they exist (None when freed); ``shard``: the Parameter of this rank's n_r elements."""

    def __init__(self, params: list[Parameter], rank: int, world_size: int):
        self.params = list(params)
        self.shapes = [p.shape for p in self.params]
        self.sizes = [p.size for p in self.params]
        self.n = sum(self.sizes)
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


def check_wrapper_inputs(comm, model, make_optimizer, loss_fn) -> list[Module]:
    """The checks ZeRO and FSDP share, before anything changes; returns the model's leaf layers.

    Raises TypeError for a wrong comm / model / make_optimizer / loss_fn, ValueError for a model without
    parameters, parameters of several dtypes, a parameter shared by two layers, or replicas that differ.
    """
    if not (hasattr(comm, "rank") and hasattr(comm, "world_size")):
        raise TypeError(f"comm must be a Communicator, got {type(comm).__name__}")
    if not isinstance(model, Module):
        raise TypeError(f"model must be a minidist Module, got {type(model).__name__}")
    if not callable(make_optimizer) or hasattr(make_optimizer, "step"):
        raise TypeError("make_optimizer must be a function params -> optimizer "
                        "(e.g. lambda ps: Adam(ps, lr=1e-3)),"
                        f" got {type(make_optimizer).__name__}: the optimizer is built on this rank's shards")
    if not (callable(getattr(loss_fn, "forward", None)) and callable(getattr(loss_fn, "backward", None))):
        raise TypeError("loss_fn must have forward(logits, target) and backward(), got "
                        f"{type(loss_fn).__name__}")
    params = model.parameters()
    if not params:
        raise ValueError("model has no parameters: nothing to shard")
    if len({p.data.dtype for p in params}) > 1:
        raise TypeError("all parameters must share one dtype, got "
                        f"{sorted({str(p.data.dtype) for p in params})}")
    layers = leaf_layers(model)
    seen: dict[int, int] = {}
    for i, layer in enumerate(layers):
        for p in layer.parameters():
            if id(p) in seen:
                raise ValueError(f"{p!r} is shared (layers {seen[id(p)]} and {i}): a sharded wrapper frees "
                                 "and re-gathers each layer's parameters, so a parameter must belong to "
                                 "exactly one layer, once (untie the weights)")
            seen[id(p)] = i
    check_same_layout(comm, params)
    check_same_values(comm, params,
                      "replicas start different: build the model from the same seed on every rank")
    return layers


def build_optimizer(make_optimizer, shards: list[Parameter]):
    """make_optimizer(shards), checked: an element-wise minidist optimizer over exactly these shards."""
    optimizer = make_optimizer(shards)
    for name in ("step", "zero_grad", "state_dict", "load_state_dict"):
        if not callable(getattr(optimizer, name, None)):
            raise TypeError(f"make_optimizer must return an optimizer with .{name}(), got "
                            f"{type(optimizer).__name__}")
    if isinstance(optimizer, LARS):
        raise TypeError("LARS scales each parameter by its whole norm; a shard cuts parameters, so sharded "
                        "data parallelism supports the element-wise optimizers "
                        "(SGD, Adam, AdamW, RMSprop, Adagrad)")
    if [id(p) for p in getattr(optimizer, "params", shards)] != [id(s) for s in shards]:
        raise ValueError("make_optimizer must build the optimizer on the parameters it is given (the shards)")
    return optimizer


def check_algorithm(algorithm: str) -> str:
    """Only the ring's chunking is the one the shards follow."""
    if algorithm != "ring" or algorithm not in ALGORITHMS:
        raise ValueError("sharded data parallelism uses ring reduce_scatter/allgather; got algorithm "
                         f"{algorithm!r}")
    return algorithm


def state_dict(wrapper) -> dict:
    """The optimizer's state of this rank's shards, tagged with the world size, rank and stage."""
    state = {"world_size": wrapper.comm.world_size, "rank": wrapper.comm.rank, "stage": wrapper.stage,
             "optimizer": wrapper.optimizer.state_dict()}
    return {**state, **wrapper.precision.save(wrapper.groups)}   # mixed: the fp32 master shards, the scale


def load_state_dict(wrapper, state: dict) -> None:
    """Load what ``state_dict`` returned on the same rank of a run with the same P and stage."""
    if not isinstance(state, dict) or not {"world_size", "rank", "stage", "optimizer"} <= set(state):
        raise ValueError("expected a dict from a sharded wrapper's state_dict() "
                         "(world_size, rank, stage, optimizer)")
    p, r = wrapper.comm.world_size, wrapper.comm.rank
    if state["world_size"] != p or state["rank"] != r:
        raise ValueError(f"this optimizer state holds rank {state['rank']}'s shards of a run with P = "
                         f"{state['world_size']}; this is rank {r} of P = {p}: shards of another P cover "
                         "other elements (gather the full state and re-shard it first)")
    if state["stage"] != wrapper.stage:
        raise ValueError(f"state saved by ZeRO stage {state['stage']}, this is stage {wrapper.stage}")
    mixed = wrapper.precision.keeps_masters
    if ("mixed" in state) != mixed:
        raise ValueError("state saved " + ("with" if "mixed" in state else "without") + " mixed precision "
                         "(fp32 master shards); this wrapper runs " + ("with" if mixed else "without"))
    wrapper.optimizer.load_state_dict(state["optimizer"])
    wrapper.precision.restore(state, wrapper)
