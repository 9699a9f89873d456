"""Parallel training strategies on the simulated cluster, each checked against one process.

One folder per strategy, the strategy beside its own communication and cost model. The synchronous ones are
attachments of the step runner (minidist/nn/runner.py: layer-by-layer forward, loss, backward, events);
minidist/sim/compute.py's ComputeCharges is the attachment that charges compute to the simulated clock,
minidist/sim/memory.py's MemoryRecorder the one that records a memory ledger. mesh.py places the ranks on
named axes (Mesh: one communicator per axis); compose/ (parallelize, Trainer, split_for_mesh) composes any
subset of data, pipeline, tensor, context and expert parallelism on one model and one mesh.
lessons/ONE_GRADIENT.md follows one gradient through a data × tensor hybrid.

data/       data parallelism: naive.py (NaiveDataParallel: read first), data_parallel.py (DataParallel,
            bucketed), buckets.py (gradient buckets, GradientReadiness: which gradients are ready),
            sync.py (GradientSync: DDP's buckets), overlap.py (communication overlapping
            backward on the simulated clock), ZeRO: zero_sync.py (ZeroSync), zero.py (stages 1-3, 3 = FSDP),
            zero_mixed.py, flat.py
pipeline/   pipeline parallelism: pipeline.py (stages, executor, its clock, timeline and memory books),
            schedule.py (naive, GPipe, 1F1B as tables), split.py (cutting a Sequential into stages),
            comm.py (point-to-point, StageLinks)
spatial/    spatial parallelism: spatial.py (convolutions over H / H×W blocks), partition.py, comm.py
            (halo exchange), cost.py
tensor/     intralayer model parallelism: layers.py (column/row-parallel Linear), mlp.py (the Megatron
            MLP block), comm.py (Megatron's f and g), cost.py
expert/     expert parallelism: expert_parallel.py (experts over ranks, all-to-all dispatch/combine),
            transform.py (expert_parallel), cost.py
shards.py   a rank's slice of the batch and its loss weight (every data-like strategy's);
            sync_batchnorm.py: batch statistics over a group of ranks (data: SyncBatchNorm; spatial)
grids/      what parallelize cannot build: data_tensor.py (data × tensor of an MLP), data_spatial.py
            (data × spatial of a CNN: spatial is not a parallelize axis)
compose/    parallelize: refusals.py (every check before the model is touched), split_model.py
            (split_for_mesh: a GPT or Switch model split for a mesh, as its units), trainer.py (one step
            runner for one pipeline rank, the Pipeline executor for more), batch.py, state.py
asynchronous/  training that does not wait: parameter servers with staleness, local SGD, elastic
            averaging, Hogwild!
compression/   gradients that send fewer bits: 1-bit SGD, top-k, Deep Gradient Compression, error feedback
rnn/        the distributed persistent RNN: hidden units split over ranks, one exchange per timestep
"""

from .asynchronous import train_elastic, train_elastic_async, train_local_sgd, train_parameter_server
from .compose import Trainer, parallelize, split_for_mesh
from .compression import DGC, CompressedDataParallel, ErrorFeedback, OneBit, TopK
from .data import DataParallel, SyncBatchNorm, ZeRO, convert_sync_batchnorm
from .mesh import Mesh, MeshShape

# isort: split
from .expert import ExpertParallelMoE
from .pipeline import Pipeline, bubble_fraction, format_schedule, make_schedule
from .rnn import PersistentRNN
from .spatial import (
    GridAllgather,
    HaloPlan,
    SpatialAvgPool2d,
    SpatialBatchNorm2d,
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

# isort: split
from .grids import GridSpatial, hybrid_train_step

__all__ = [
    "ColumnParallelLinear",
    "CompressedDataParallel",
    "DGC",
    "DataParallel",
    "ErrorFeedback",
    "ExpertParallelMoE",
    "GridSpatial",
    "GridAllgather",
    "HaloPlan",
    "MegatronMLP",
    "Mesh",
    "MeshShape",
    "PersistentRNN",
    "OneBit",
    "Pipeline",
    "RowParallelLinear",
    "SpatialAvgPool2d",
    "SpatialBatchNorm2d",
    "SpatialConv2d",
    "SpatialMaxPool2d",
    "SyncBatchNorm",
    "TopK",
    "Trainer",
    "ZeRO",
    "bubble_fraction",
    "column_parallel_mlp",
    "convert_sync_batchnorm",
    "format_schedule",
    "gather_from_grid",
    "hybrid_train_step",
    "make_schedule",
    "megatron_parallel_mlp",
    "parallelize",
    "split_for_mesh",
    "scatter_to_grid",
    "spatialize",
    "train_elastic",
    "train_elastic_async",
    "train_local_sgd",
    "train_parameter_server",
]
