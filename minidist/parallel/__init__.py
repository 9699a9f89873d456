"""Parallel training strategies on the simulated cluster, each checked against one process.

One folder per strategy, each beside its own communication and cost model (each folder's docstring lists
its files). The synchronous strategies are attachments of the step runner (minidist/nn/runner.py).
mesh.py places the ranks on named axes (Mesh: one communicator per axis); compose/ (parallelize, Trainer,
split_for_mesh) composes any subset of data, pipeline, tensor, context and expert parallelism on one model
and one mesh. lessons/ONE_GRADIENT.md follows one gradient through a data × tensor hybrid.

data/ pipeline/ tensor/ context/ expert/   the five axes of a Mesh
spatial/       spatial parallelism: convolutions over H / H×W blocks, halo exchange
grids/         what parallelize cannot build: data × tensor of an MLP, data × spatial of a CNN
asynchronous/  training that does not wait: parameter servers, local SGD, elastic averaging, Hogwild!
compression/   gradients that send fewer bits: 1-bit SGD, top-k, Deep Gradient Compression, error feedback
rnn/           the distributed persistent RNN: hidden units split over ranks, one exchange per timestep
shards.py      a rank's slice of the batch and its loss weight (every data-like strategy's);
               sync_batchnorm.py: batch statistics over a group of ranks
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
    "GridAllgather",
    "HaloPlan",
    "MegatronMLP",
    "Mesh",
    "MeshShape",
    "Pipeline",
    "RowParallelLinear",
    "SpatialAvgPool2d",
    "SpatialConv2d",
    "SpatialMaxPool2d",
    "bubble_fraction",
    "column_parallel_mlp",
    "format_schedule",
    "gather_from_grid",
    "hybrid_train_step",
    "make_schedule",
    "megatron_parallel_mlp",
    "parallelize",
    "split_for_mesh",
    "scatter_to_grid",
    "spatialize",
]
