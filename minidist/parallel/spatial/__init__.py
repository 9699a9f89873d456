"""Spatial parallelism: spatial.py (convolutions and pools over a grid of image blocks), partition.py
(which rows and columns each rank owns and needs), comm.py (the halo exchange), cost.py (the step's
time on the simulated clock)."""

from .batchnorm import SpatialBatchNorm2d
from .comm import exchange_halo, return_halo_gradient
from .cost import forward_time_1d, local_conv_flops, rehearse_conv_step
from .partition import AxisPartition, HaloPlan, Transfer, intersect, length, split_bounds
from .spatial import (
    GridAllgather,
    SpatialAvgPool2d,
    SpatialConv2d,
    SpatialMaxPool2d,
    assemble,
    gather_from_grid,
    grid_blocks,
    scatter_to_grid,
    spatialize,
)

__all__ = [
    "SpatialBatchNorm2d",
    "AxisPartition",
    "GridAllgather",
    "HaloPlan",
    "SpatialAvgPool2d",
    "SpatialConv2d",
    "SpatialMaxPool2d",
    "Transfer",
    "assemble",
    "exchange_halo",
    "forward_time_1d",
    "gather_from_grid",
    "grid_blocks",
    "intersect",
    "length",
    "local_conv_flops",
    "rehearse_conv_step",
    "return_halo_gradient",
    "scatter_to_grid",
    "spatialize",
    "split_bounds",
]
