"""Parallel training strategies on the simulated cluster, each checked against one process.

data.py       data parallelism (sharded batches, bucketed gradient allreduce, overlap on the clock)
pipeline.py   pipeline parallelism (GPipe, 1F1B; schedules as data in pipeline_schedule.py)
spatial.py    spatial parallelism (convolutions split over H / H×W with halo exchange, halo.py)
tensor.py     intralayer model parallelism (column/row-parallel Linear, the Megatron MLP block)
hybrid.py     data × model parallelism on a 2-D grid of ranks
"""

from .data import DataParallel
from .hybrid import Grid, hybrid_train_step
from .pipeline import Pipeline
from .pipeline_schedule import format_schedule, make_schedule
from .spatial import (
                      GridAllgather,
                      SpatialAvgPool2d,
                      SpatialConv2d,
                      SpatialMaxPool2d,
                      gather_from_grid,
                      scatter_to_grid,
                      spatialize,
)
from .spatial_partition import HaloPlan
from .tensor import (
                      ColumnParallelLinear,
                      MegatronMLP,
                      RowParallelLinear,
                      column_parallel_mlp,
                      megatron_parallel_mlp,
)

__all__ = [
                      "ColumnParallelLinear",
                      "DataParallel",
                      "Grid",
                      "GridAllgather",
                      "HaloPlan",
                      "MegatronMLP",
                      "Pipeline",
                      "RowParallelLinear",
                      "SpatialAvgPool2d",
                      "SpatialConv2d",
                      "SpatialMaxPool2d",
                      "column_parallel_mlp",
                      "format_schedule",
                      "gather_from_grid",
                      "hybrid_train_step",
                      "make_schedule",
                      "megatron_parallel_mlp",
                      "scatter_to_grid",
                      "spatialize",
]
