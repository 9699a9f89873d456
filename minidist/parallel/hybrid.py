"""Hybrid data × model parallelism on a 2-D grid of ranks ("Distributed Deep Learning (Part II)"
slides: "use an integrated/hybrid data and model parallelism", Gholami et al., SPAA 2018).

P = D·M ranks form a grid of D rows and M columns; rank r sits at row r // M, column r % M:

            model-parallel group (one row: splits the weights, shares one slice of the batch)
    row 0:  rank 0   rank 1   ...  rank M−1
    row 1:  rank M   rank M+1 ...  rank 2M−1          data-parallel group (one column: holds the same
    ...                                               weight shard, sees different slices of the batch)

Each row runs the model-parallel layers of ``minidist.parallel.tensor`` on its communicator ``model_comm``
with batch slice B_j (minidist.split cuts the batch into D pieces). Each column then all-reduces the
gradients of its shard over ``data_comm`` (data/sync.py's GradientSync, attached to the step runner), so
all D copies of a shard take the same step. The ranks' places: a Mesh of axes data × model (mesh.py).
D = 1 is pure model parallelism; M = 1 pure data parallelism.

The loss is a mean over the whole batch B, so row j scales its loss gradient by B_j/B before backward:
the sum over rows of (B_j/B)·(mean over B_j) is then the mean over B, for even and uneven splits alike.
"""

from __future__ import annotations

import numpy as np

from minidist.checks import check_count
from minidist.nn.runner import StepRunner
from minidist.split import split_range

from .data.comm import allreduce_gradients
from .data.sync import GradientSync
from .mesh import Mesh, MeshShape
from .shards import ShardWeightedLoss

__all__ = ["Grid", "allreduce_gradients", "hybrid_train_step"]


class Grid:
    """The D × M grid over ``comm``: ``model_comm`` (this rank's row), ``data_comm`` (its column)."""

    def __init__(self, comm, model_parallel: int):
        model_parallel = check_count(model_parallel, "model_parallel")
        if model_parallel < 1 or comm.world_size % model_parallel:
            raise ValueError(f"a grid of {comm.world_size} ranks cannot have {model_parallel} model-parallel "
                             f"ranks per row: the world size must be a multiple of it")
        self.comm = comm
        self.model_parallel = model_parallel
        self.data_parallel = comm.world_size // model_parallel
        self.mesh = Mesh.of_shape(comm, MeshShape([("data", self.data_parallel), ("model", model_parallel)]))
        self.row, self.column = self.mesh.coords["data"], self.mesh.coords["model"]
        self.model_comm, self.data_comm = self.mesh.group("model"), self.mesh.group("data")

    def batch_slice(self, batch: int) -> slice:
        """The rows of a batch of ``batch`` samples that this rank's grid row trains on."""
        if batch < self.data_parallel:
            raise ValueError(f"a batch of {batch} cannot be split over {self.data_parallel} data-parallel "
                             f"rows: each row needs at least one sample")
        return slice(*split_range(batch, self.data_parallel, self.row))

    @property
    def bytes_sent(self) -> int:
        """Payload bytes this rank has sent over its world, row and column communicators (each split
        communicator keeps its own counters in ``stats``)."""
        return sum(c.stats.bytes_sent for c in (self.comm, self.model_comm, self.data_comm))

    def __repr__(self) -> str:
        return (f"Grid(D={self.data_parallel} × M={self.model_parallel}, rank {self.comm.rank} at "
                f"row {self.row}, column {self.column})")


def hybrid_train_step(grid: Grid, model, loss_fn, optimizer, x: np.ndarray, target: np.ndarray) -> float:
    """One step of hybrid training on the whole batch (x, target), identical on every rank.

    ``model`` is built on ``grid.model_comm`` (e.g. ``megatron_parallel_mlp(grid.model_comm, full)``).
    Returns this row's share (B_j/B)·loss_j of the batch loss; summed over the rows it is the batch loss.
    """
    rows = grid.batch_slice(len(x))
    share = (rows.stop - rows.start) / len(x)
    optimizer.zero_grad()
    sync = GradientSync(model, grid.data_comm, overlap=False)        # the column's sum, after backward
    runner = StepRunner(model, ShardWeightedLoss(loss_fn, share), [sync])
    loss = runner.forward_backward(x[rows], target[rows])
    optimizer.step()
    return loss * share
