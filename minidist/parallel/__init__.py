"""Parallel training strategies on the simulated cluster, each checked against one process.

One folder per strategy, beside its communication and cost model (its docstring lists its files); the
synchronous ones attach to the step runner (nn/runner.py). mesh.py names the ranks' axes, compose/
(parallelize) composes the five on one model and one mesh; lessons/ONE_GRADIENT.md walks one gradient.

data/ pipeline/ tensor/ context/ expert/   the five axes of a Mesh
spatial/       spatial parallelism: convolutions over H / H×W blocks, halo exchange
grids/         what parallelize cannot build: data × tensor of an MLP, data × spatial of a CNN
asynchronous/  training that does not wait: parameter servers, local SGD, elastic averaging, Hogwild!
compression/   gradients that send fewer bits: 1-bit SGD, top-k, Deep Gradient Compression, error feedback
rnn/           the distributed persistent RNN: hidden units split over ranks, one exchange per timestep
shards.py      a rank's slice of the batch and its loss weight; sync_batchnorm.py: SyncBatchNorm
"""

from .compose import parallelize, split_for_mesh
from .data import DataParallel
from .grids import hybrid_train_step
from .mesh import Mesh, MeshShape
from .pipeline import Pipeline, bubble_fraction, format_schedule, make_schedule
from .spatial import (
    GridAllgather,
    HaloPlan,
    SpatialAvgPool2d,
    SpatialConv2d,
    SpatialMaxPool2d,
    gather_from_grid,
    scatter_to_grid,
    spatialize,
)
from .tensor.layers import ColumnParallelLinear, RowParallelLinear
from .tensor.mlp import MegatronMLP, column_parallel_mlp, megatron_parallel_mlp

__all__ = ["ColumnParallelLinear", "DataParallel", "GridAllgather", "HaloPlan", "MegatronMLP", "Mesh",
           "MeshShape", "Pipeline", "RowParallelLinear", "SpatialAvgPool2d", "SpatialConv2d",
           "SpatialMaxPool2d", "bubble_fraction", "column_parallel_mlp", "format_schedule",
           "gather_from_grid", "hybrid_train_step", "make_schedule", "megatron_parallel_mlp", "parallelize",
           "split_for_mesh", "scatter_to_grid", "spatialize"]
