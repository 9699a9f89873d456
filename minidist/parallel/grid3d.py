"""3-D parallelism: a D × P × T grid of ranks (data × pipeline × tensor), placed on a two-level cluster.

Rank r sits at (d, p, t). With ``placement="tensor_inside"`` (the default, Megatron-LM's order) the
tensor index varies fastest, r = (d·P + p)·T + t, so each tensor group is T consecutive ranks: on a
cluster of nodes of G ranks (G a multiple of T) a tensor group never leaves its node, and its two
allreduces per layer pair run on the fast links. ``placement="tensor_across"`` makes the data index
fastest, r = (t·P + p)·D + d: the tensor groups then straddle nodes (the bad placement the lesson times).

    grid = Grid3D(comm, data=2, pipeline=2, tensor=2)       # comm.split three times (collective)
    stage = grid.stage(blocks)                              # this rank's (Linear, act, Linear) blocks
    loss = grid.train_step(stage, MSELoss(), optimizer, x, target)

A step: the data group's batch slice B_d enters pipeline stage 0; each stage runs its blocks tensor-
parallel (column- then row-parallel Linear, one allreduce forward, one backward), sends its activation
to the next stage, the last stage computes the loss (scaled by B_d/B, as in hybrid.py), the gradients
come back stage by stage, and each data group sums its gradients (recursive doubling) before the step.
Nothing is rewritten here: the stage is tensor/'s layers run by the step runner, the messages are the
pipeline's point-to-point (pipeline/comm.py), the gradient sum is data/comm.py's one-bucket allreduce.
Source: the "Scaling Up Training" slides (hybrid data × model parallelism) and Megatron-LM's 3-D grid.
"""

from __future__ import annotations

import copy

import numpy as np

from minidist.checks import is_count
from minidist.cluster.topology import topology_of, world_ranks
from minidist.nn import Linear, Sequential
from minidist.nn.runner import StepRunner
from minidist.split import split_range

from .data.comm import allreduce_gradients
from .data.shards import ShardWeightedLoss
from .pipeline.comm import recv_activation, recv_gradient, send_activation, send_gradient
from .tensor import ColumnParallelLinear, RowParallelLinear

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
        self.d, self.p, self.t = self.coords(comm.rank)
        if require_tensor_in_node:
            self._check_tensor_in_node()
        # split is collective: every rank makes the three calls in the same order
        self.tensor_comm = comm.split(color=self.d * pipeline + self.p, key=self.t)
        self.pipe_comm = comm.split(color=self.d * tensor + self.t, key=self.p)
        self.data_comm = comm.split(color=self.p * tensor + self.t, key=self.d)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(d, p, t) of a rank of ``comm`` under this grid's placement."""
        data, pipeline, tensor = self.sizes
        if self.placement == "tensor_inside":
            rest, t = divmod(rank, tensor)
            d, p = divmod(rest, pipeline)
        else:
            rest, d = divmod(rank, data)
            t, p = divmod(rest, pipeline)
        return d, p, t

    def _check_tensor_in_node(self) -> None:
        topo = topology_of(self.comm)
        if topo is None:
            return
        ranks = world_ranks(self.comm)
        for r in range(self.comm.world_size):
            same = [q for q in range(self.comm.world_size) if self.coords(q)[:2] == self.coords(r)[:2]]
            nodes = {topo.node(ranks[q]) for q in same}
            if len(nodes) > 1:
                raise ValueError(f"the tensor group of rank {r} spans nodes {sorted(nodes)}: tensor groups "
                                 "must stay inside a node "
                                 "(placement='tensor_inside', T dividing the node size)")

    def stage(self, blocks: list[tuple[Linear, object, Linear]]) -> Sequential:
        """This rank's pipeline stage: its share of ``blocks`` (split_range over P), each block
        (Linear, element-wise activation, Linear) column- then row-parallel over ``tensor_comm``."""
        lo, hi = split_range(len(blocks), self.sizes[1], self.p)
        if hi == lo:
            raise ValueError(f"{len(blocks)} blocks cannot fill {self.sizes[1]} pipeline stages")
        layers = []
        for i, (first, act, second) in enumerate(blocks[lo:hi]):
            needs_dx = self.p > 0 or i > 0         # the network's input needs no gradient
            layers += [ColumnParallelLinear.from_linear(self.tensor_comm, first, gather_output=False,
                                                        input_grad=needs_dx),
                       copy.deepcopy(act),
                       RowParallelLinear.from_linear(self.tensor_comm, second, input_is_parallel=True)]
        return Sequential(*layers)

    def train_step(self, stage: Sequential, loss_fn, optimizer, x: np.ndarray, target: np.ndarray):
        """One step on the whole batch (x, target); returns the loss share (B_d/B)·loss_d on the last
        stage, None on the others."""
        lo, hi = split_range(len(x), self.sizes[0], self.d)
        if hi == lo:
            raise ValueError(f"a batch of {len(x)} cannot feed {self.sizes[0]} data-parallel groups")
        share, last = (hi - lo) / len(x), self.p == self.sizes[1] - 1
        optimizer.zero_grad()
        runner = StepRunner(stage, ShardWeightedLoss(loss_fn, share), input_grad=self.p > 0)
        h = x[lo:hi] if self.p == 0 else recv_activation(self.pipe_comm, 0)   # the pipeline's p2p, M = 1
        loss = None
        if last:
            loss = runner.forward_backward(h, target[lo:hi]) * share
        else:
            send_activation(self.pipe_comm, runner.forward(h), 0)
            runner.dx = runner.backward(recv_gradient(self.pipe_comm, 0))
        if self.p > 0:
            send_gradient(self.pipe_comm, runner.dx, 0)
        allreduce_gradients(self.data_comm, stage.parameters(), algorithm="recursive_doubling")
        optimizer.step()
        return loss
