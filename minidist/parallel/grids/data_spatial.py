"""Data × spatial parallelism: D data-parallel groups, each a spatial group of S = Ph·Pw ranks.

Why not parallelize: spatial is not one of its axes (this grid splits a CNN's images into blocks of rows
and columns; parallelize splits GPTs).

Rank r sits at (d, s). With ``placement="spatial_inside"`` (the default) the spatial index varies
fastest, r = d·S + s, so each spatial group is S consecutive ranks: on a cluster of nodes of G ranks (G a
multiple of S) it never leaves its node. ``placement="spatial_across"`` makes the data index fastest,
r = s·D + d: the spatial groups then straddle nodes.

    grid = GridSpatial(comm, data=2, spatial=(2, 1))            # comm.split twice (collective)
    net = grid.spatialize(model, input_hw=(H, W))               # SpatialConv2d ... on spatial_comm
    loss = grid.train_step(net, CrossEntropyLoss(), optimizer, x, target)

A step: spatial group d takes its slice B_d of the batch (minidist.split) and each of its ranks the block
s of every image; the spatial layers exchange halos, and the convolutions' gradients, partial over the
spatial group (a convolution's gradient is the sum over the blocks), are summed over it as backward passes
them (GradientSync, their partial_over); the replicated head
runs on the allgathered image. The loss gradient is scaled by B_d/B, so summing every gradient over the
data group (one bucket) gives the mean over the whole batch: Σ_d (B_d/B)·mean_d = mean. Spatial traffic
(halos at every layer, forward and backward) is frequent and small; the data group's is one bucket per
step; so the spatial group is the one to keep on a node's fast links.
Source: the "Distributed Deep Learning (Part II)" slides (spatial parallel training; hybrid parallelism).
"""

from __future__ import annotations

import numpy as np

from minidist.cluster.topology import groups_across_nodes
from minidist.collectives import ALGORITHMS
from minidist.collectives.hierarchical import TOPOLOGY_ALGORITHMS
from minidist.nn.runner import StepRunner
from minidist.split import split_range

from ..data.sync import GradientSync
from ..mesh import Mesh, MeshShape
from ..shards import ShardWeightedLoss
from ..spatial import grid_blocks, spatialize

PLACEMENTS = ("spatial_inside", "spatial_across")


class GridSpatial:
    """The D × (Ph·Pw) grid over ``comm``: ``spatial_comm`` and ``data_comm`` of this rank.

    data: D; spatial: (Ph, Pw), the split of every image's height and width inside a spatial group.
    require_spatial_in_node: raise ValueError if a spatial group spans nodes of the run's Topology.
    algorithm: the allreduce of the data group's gradient bucket.
    """

    def __init__(self, comm, data: int, spatial: tuple[int, int], placement: str = "spatial_inside",
                 require_spatial_in_node: bool = False, algorithm: str = "ring"):
        ok = isinstance(spatial, tuple) and len(spatial) == 2
        if not ok or not all(type(v) is int and v >= 1 for v in spatial) or type(data) is not int or data < 1:
            raise ValueError(f"a data × spatial grid needs an int data >= 1 and spatial = (Ph, Pw) of ints "
                             f">= 1, got data={data!r}, spatial={spatial!r}")
        if data * spatial[0] * spatial[1] != comm.world_size:
            raise ValueError(f"a D × (Ph·Pw) grid needs D·Ph·Pw = world size {comm.world_size}, got "
                             f"{data} × ({spatial[0]}·{spatial[1]})")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        if algorithm != "auto" and algorithm not in ALGORITHMS and algorithm not in TOPOLOGY_ALGORITHMS:
            raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, {sorted(TOPOLOGY_ALGORITHMS)} "
                             f"or 'auto', got {algorithm!r}")
        self.comm, self.data, self.spatial, self.placement = comm, data, spatial, placement
        self.algorithm = algorithm
        order = [("data", data), ("spatial", spatial[0] * spatial[1])]
        self.shape = MeshShape(order if placement == "spatial_inside" else order[::-1])
        self.d, self.s = self.coords(comm.rank)
        spans = groups_across_nodes(comm, lambda r: self.coords(r)[0]) if require_spatial_in_node else {}
        if spans:
            d, nodes = next(iter(spans.items()))
            raise ValueError(f"spatial group {d} spans nodes {nodes}: spatial groups must stay inside a node "
                             f"(placement='spatial_inside', Ph·Pw dividing the node size)")
        self.mesh = Mesh.of_shape(comm, self.shape)
        self.spatial_comm, self.data_comm = self.mesh.group("spatial"), self.mesh.group("data")

    def coords(self, rank: int) -> tuple[int, int]:
        """(d, s) of a rank of ``comm``: its data group and its place in the spatial group (s = i·Pw + j)."""
        at = self.shape.coords(rank)
        return at["data"], at["spatial"]

    def spatialize(self, model, input_hw: tuple[int, int]):
        """This rank's spatially parallel twin of ``model`` on ``spatial_comm`` (shares its Parameters).

        model: Sequential of convs / pools / element-wise layers, then Flatten and the head (no
        BatchNorm); input_hw: the global (H, W) of its input. See minidist.parallel.spatial.spatialize.
        """
        self.input_hw = tuple(input_hw)
        return spatialize(model, self.spatial_comm, self.spatial, self.input_hw)

    def block(self, x: np.ndarray) -> np.ndarray:
        """x: the whole batch, (B, C, H, W). Returns this rank's part: its data group's slice B_d of the
        batch, its spatial block of every image, (B_d, C, h, w), contiguous."""
        hw = getattr(self, "input_hw", None)           # set by spatialize
        if not isinstance(x, np.ndarray) or x.ndim != 4 or tuple(x.shape[2:]) != hw:
            raise ValueError(f"expected a batch (B, C, H, W) with (H, W) = the input_hw given to spatialize "
                             f"({hw}), got {getattr(x, 'shape', type(x).__name__)}")
        lo, hi = self._rows(len(x))
        rows, cols = grid_blocks(self.input_hw, self.spatial)[self.s]
        return np.ascontiguousarray(x[lo:hi, :, rows, cols])

    def _rows(self, batch: int) -> tuple[int, int]:
        if batch < self.data:
            raise ValueError(f"a batch of {batch} cannot feed {self.data} data-parallel groups")
        return split_range(batch, self.data, self.d)

    def train_step(self, net, loss_fn, optimizer, x: np.ndarray, target: np.ndarray) -> float:
        """One step on the whole batch x (B, C, H, W), target (B, ...), the same on every rank.

        net: from ``spatialize``; optimizer over the model's parameters. Returns this data group's loss
        share (B_d/B)·loss_d (the same on every rank of the group); summed over the groups: the batch loss.
        """
        local = self.block(x)
        lo, hi = self._rows(len(x))
        share = (hi - lo) / len(x)
        optimizer.zero_grad()
        # GradientSync: the convs' partial sums over S as backward passes them, the weighted sums over D
        sync = GradientSync(net, self.data_comm, algorithm=self.algorithm, overlap=False)
        runner = StepRunner(net, ShardWeightedLoss(loss_fn, share), [sync])
        loss = runner.forward_backward(local, target[lo:hi])
        optimizer.step()
        return loss * share
