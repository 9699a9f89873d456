"""Data × spatial parallelism: D data-parallel groups, each a spatial group of S = Ph·Pw ranks.

Rank r sits at (d, s). With ``placement="spatial_inside"`` (the default) the spatial index varies
fastest, r = d·S + s, so each spatial group is S consecutive ranks: on a cluster of nodes of G ranks (G a
multiple of S) it never leaves its node. ``placement="spatial_across"`` makes the data index fastest,
r = s·D + d: the spatial groups then straddle nodes.

    grid = GridSpatial(comm, data=2, spatial=(2, 1))            # comm.split twice (collective)
    net = grid.spatialize(model, input_hw=(H, W))               # SpatialConv2d ... on spatial_comm
    loss = grid.train_step(net, CrossEntropyLoss(), optimizer, x, target)

A step is data_tensor.py's hybrid step with the spatial group in the tensor group's place: spatial group d
takes its slice B_d of the batch and each of its ranks the block s of every image; the convolutions'
gradients, partial over the spatial group, and every gradient over the data group are summed as backward
passes them (GradientSync). Spatial traffic (halos at every layer, forward and backward) is frequent and
small, the data group's one bucket per step: the spatial group is the one to keep on a node's fast links.
Source: the "Distributed Deep Learning (Part II)" slides (spatial parallel training; hybrid parallelism).
"""

from __future__ import annotations

import numpy as np

from minidist.cluster.topology import groups_across_nodes
from minidist.nn.checks import is_count

from ..mesh import Mesh, MeshShape
from ..spatial import grid_blocks, spatialize
from .data_tensor import hybrid_train_step

PLACEMENTS = ("spatial_inside", "spatial_across")


class GridSpatial:
    """The D × (Ph·Pw) grid over ``comm``: ``spatial_comm`` and ``data_comm`` of this rank.

    data: D; spatial: (Ph, Pw), the split of every image's height and width inside a spatial group.
    require_spatial_in_node: raise ValueError if a spatial group spans nodes of the run's Topology.
    """

    def __init__(self, comm, data: int, spatial: tuple[int, int], placement: str = "spatial_inside",
                 require_spatial_in_node: bool = False):
        pair = isinstance(spatial, tuple) and len(spatial) == 2
        if not pair or not all(is_count(v) for v in (data, *spatial)):
            raise ValueError(f"a data × spatial grid needs an int data >= 1 and spatial = (Ph, Pw) of ints "
                             f">= 1, got data={data!r}, spatial={spatial!r}")
        if data * spatial[0] * spatial[1] != comm.world_size:
            raise ValueError(f"a D × (Ph·Pw) grid needs D·Ph·Pw = world size {comm.world_size}, got "
                             f"{data} × ({spatial[0]}·{spatial[1]})")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        self.comm, self.data, self.spatial, self.placement = comm, data, spatial, placement
        order = [("data", data), ("spatial", spatial[0] * spatial[1])]
        self.shape = MeshShape(order if placement == "spatial_inside" else order[::-1])
        at = self.shape.coords(comm.rank)
        self.d, self.s = at["data"], at["spatial"]         # s = i·Pw + j: the block of the image
        spans = groups_across_nodes(comm, lambda r: self.shape.coords(r)["data"]) if require_spatial_in_node \
            else {}
        if spans:
            d, nodes = next(iter(spans.items()))
            raise ValueError(f"spatial group {d} spans nodes {nodes}: spatial groups must stay inside a node "
                             f"(placement='spatial_inside', Ph·Pw dividing the node size)")
        self.mesh = Mesh.of_shape(comm, self.shape)
        self.spatial_comm, self.data_comm = self.mesh.group("spatial"), self.mesh.group("data")

    def spatialize(self, model, input_hw: tuple[int, int]):
        """This rank's spatially parallel twin of ``model`` on ``spatial_comm`` (spatial.spatialize: the same
        Parameters; no BatchNorm: its statistics would span one data group); input_hw: the global (H, W)."""
        self.input_hw = tuple(input_hw)
        return spatialize(model, self.spatial_comm, self.spatial, self.input_hw)

    def block(self, x: np.ndarray) -> np.ndarray:
        """x: the whole batch, (B, C, H, W). Returns this rank's block of every image, (B, C, h, w),
        contiguous (the step then takes its data group's rows B_d of it)."""
        hw = getattr(self, "input_hw", None)           # set by spatialize
        if not isinstance(x, np.ndarray) or x.ndim != 4 or tuple(x.shape[2:]) != hw:
            raise ValueError(f"expected a batch (B, C, H, W) with (H, W) = the input_hw given to spatialize "
                             f"({hw}), got {getattr(x, 'shape', type(x).__name__)}")
        if len(x) < self.data:
            raise ValueError(f"a batch of {len(x)} cannot feed {self.data} data-parallel groups")
        rows, cols = grid_blocks(self.input_hw, self.spatial)[self.s]
        return np.ascontiguousarray(x[:, :, rows, cols])

    def train_step(self, net, loss_fn, optimizer, x: np.ndarray, target: np.ndarray) -> float:
        """One step on the whole batch x (B, C, H, W), target (B, ...), the same on every rank; net: from
        ``spatialize``. Returns this data group's loss share (B_d/B)·loss_d; summed over the groups: the batch
        loss."""
        return hybrid_train_step(self.mesh, net, loss_fn, optimizer, self.block(x), target)
