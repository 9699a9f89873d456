"""3-D parallelism: a D × P × T grid of ranks (data × pipeline × tensor), placed on a two-level cluster.

Rank r sits at (d, p, t). With ``placement="tensor_inside"`` (the default, Megatron-LM's order) the
tensor index varies fastest, r = (d·P + p)·T + t, so each tensor group is T consecutive ranks: on a
cluster of nodes of G ranks (G a multiple of T) a tensor group never leaves its node, and its two
allreduces per layer pair run on the fast links. ``placement="tensor_across"`` makes the data index
fastest, r = (t·P + p)·D + d: the tensor groups then straddle nodes (the bad placement the lesson times).

    grid = Grid3D(comm, data=2, pipeline=2, tensor=2)       # comm.split three times (collective)
    stage = grid.stage(blocks)                              # this rank's (Linear, act, Linear) blocks
    loss = grid.train_step(stage, MSELoss(), optimizer, x, target)

Nothing of one strategy is rewritten inside another. Tensor: each block becomes tensor/'s column- then
row-parallel Linear over ``tensor_comm`` (one allreduce forward, one backward). Pipeline: pipeline/'s
``Pipeline`` over ``pipe_comm`` keeps this rank's blocks (split_range over P), runs its schedule and charges
each layer's FLOPs (this rank's share) to the clock. Data: group d's loss is weighted by B_d/B
(shards.py) and the gradients summed over ``data_comm`` (GradientSync after the table), so
Σ_d (B_d/B)·mean_d is the mean over the whole batch.
Source: the "Scaling Up Training" slides (hybrid data × model parallelism) and Megatron-LM's 3-D grid.
"""

from __future__ import annotations

import copy

import numpy as np

from minidist.checks import is_count
from minidist.cluster.topology import groups_across_nodes
from minidist.nn import Linear, Sequential
from minidist.split import split_range

from .data.sync import GradientSync
from .mesh import Mesh, MeshShape
from .pipeline.pipeline import Pipeline
from .shards import ShardWeightedLoss
from .tensor.layers import ColumnParallelLinear, RowParallelLinear

PLACEMENTS = ("tensor_inside", "tensor_across")


class Grid3D:
    """The D × P × T grid over ``comm``: ``data_comm``, ``pipe_comm``, ``tensor_comm`` of this rank.

    require_tensor_in_node: raise ValueError if a tensor group spans nodes of the run's Topology.
    """

    def __init__(self, comm, data: int, pipeline: int, tensor: int, placement: str = "tensor_inside",
                 require_tensor_in_node: bool = False):
        sizes = (data, pipeline, tensor)
        if not all(is_count(s) for s in sizes) or data * pipeline * tensor != comm.world_size:
            raise ValueError(f"a D × P × T grid needs ints >= 1 with D·P·T = world size {comm.world_size}, "
                             f"got {data} × {pipeline} × {tensor}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        self.comm, self.sizes, self.placement = comm, sizes, placement
        order = [("data", data), ("pipeline", pipeline), ("tensor", tensor)]
        self.shape = MeshShape(order if placement == "tensor_inside" else order[::-1])
        self.d, self.p, self.t = self.coords(comm.rank)
        spans = groups_across_nodes(comm, lambda r: self.coords(r)[:2]) if require_tensor_in_node else {}
        if spans:
            (d, p), nodes = next(iter(spans.items()))
            raise ValueError(f"the tensor group (d, p) = ({d}, {p}) spans nodes {nodes}: tensor groups must "
                             "stay inside a node (placement='tensor_inside', T dividing the node size)")
        self.mesh = Mesh.of_shape(comm, self.shape)
        self.tensor_comm, self.pipe_comm, self.data_comm = (self.mesh.group(a) for a in ("tensor", "pipeline",
                                                                                         "data"))
        self.pipeline: Pipeline | None = None

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(d, p, t) of a rank of ``comm`` under this grid's placement."""
        at = self.shape.coords(rank)
        return at["data"], at["pipeline"], at["tensor"]

    def stage(self, blocks: list[tuple[Linear, object, Linear]], *, num_micro_batches: int = 1,
              schedule="gpipe") -> Sequential:
        """This rank's pipeline stage: its share of ``blocks`` (split_range over P), each block
        (Linear, element-wise activation, Linear) column- then row-parallel over ``tensor_comm``.
        num_micro_batches, schedule: the Pipeline's (M must not exceed a data group's batch slice)."""
        P = self.sizes[1]
        if len(blocks) < P:
            raise ValueError(f"{len(blocks)} blocks cannot fill {P} pipeline stages")
        layers = []
        for i, (first, act, second) in enumerate(blocks):        # the network's input needs no gradient
            layers += [ColumnParallelLinear.from_linear(self.tensor_comm, first, gather_output=False,
                                                        input_grad=i > 0),
                       copy.deepcopy(act),
                       RowParallelLinear.from_linear(self.tensor_comm, second, input_is_parallel=True)]
        bounds = [3 * split_range(len(blocks), P, s)[0] for s in range(P)] + [len(layers)]
        self.pipeline = Pipeline(self.pipe_comm, Sequential(*layers), loss_fn=None, boundaries=bounds,
                                 num_micro_batches=num_micro_batches, schedule=schedule)
        # the data group's sum after the table (one bucket, recursive doubling: lesson 15's timings)
        self.pipeline.attachments.append(GradientSync(self.pipeline.module, self.data_comm,
                                                      algorithm="recursive_doubling", overlap=False))
        return self.pipeline.module

    def train_step(self, stage: Sequential, loss_fn, optimizer, x: np.ndarray, target: np.ndarray):
        """One step on the whole batch (x, target); returns the loss share (B_d/B)·loss_d on the last
        stage, None on the others."""
        if self.pipeline is None or stage is not self.pipeline.module:
            raise ValueError("train_step runs the stage the last call of grid.stage(blocks) returned")
        lo, hi = split_range(len(x), self.sizes[0], self.d)
        if hi == lo:
            raise ValueError(f"a batch of {len(x)} cannot feed {self.sizes[0]} data-parallel groups")
        share = (hi - lo) / len(x)
        self.pipeline.loss_fn = ShardWeightedLoss(loss_fn, share)    # the data group's weight B_d/B
        optimizer.zero_grad()
        loss = self.pipeline.train_step(x[lo:hi], target[lo:hi])    # ends with the data group's sum
        optimizer.step()
        return None if loss is None else loss * share
