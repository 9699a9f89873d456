"""Spatial parallelism: spatial.py (convolutions, pools and batch norms over a grid of image blocks),
partition.py (which rows and columns each rank owns and needs), comm.py (the halo exchange), cost.py (the
step's time on the simulated clock)."""

from .partition import HaloPlan
from .spatial import (
                      GridAllgather,
                      SpatialAvgPool2d,
                      SpatialBatchNorm2d,
                      SpatialConv2d,
                      SpatialMaxPool2d,
                      gather_from_grid,
                      grid_blocks,
                      scatter_to_grid,
                      spatialize,
)

__all__ = ["GridAllgather", "HaloPlan", "SpatialAvgPool2d", "SpatialBatchNorm2d", "SpatialConv2d",
           "SpatialMaxPool2d", "gather_from_grid", "grid_blocks", "scatter_to_grid", "spatialize"]
