"""Hybrid data × tensor parallelism of an MLP on a 2-D mesh ("Distributed Deep Learning (Part II)" slides:
"use an integrated/hybrid data and model parallelism", Gholami et al., SPAA 2018).

P = D·T ranks form ``Mesh(comm, data=D, tensor=T)``; rank r sits at row r // T, column r % T:

            tensor group (one row: splits the weights, shares one slice of the batch)
    row 0:  rank 0   rank 1   ...  rank T−1
    row 1:  rank T   rank T+1 ...  rank 2T−1          data group (one column: holds the same weight
    ...                                               shard, sees different slices of the batch)

Each row runs the tensor-parallel layers of ``minidist.parallel.tensor`` on ``mesh.group("tensor")`` with
batch slice B_j (split_range cuts the batch into D pieces). Each column then all-reduces the gradients of
its shard over ``mesh.group("data")`` (data/sync.py's GradientSync, attached to the step runner), so all D
copies of a shard take the same step. D = 1 is pure tensor parallelism; T = 1 pure data parallelism.

The loss is a mean over the whole batch B, so row j scales its loss gradient by B_j/B before backward:
the sum over rows of (B_j/B)·(mean over B_j) is then the mean over B, for even and uneven splits alike.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives.pieces import split_range
from minidist.nn.runner import StepRunner

from ..data.sync import GradientSync
from ..mesh import Mesh
from ..shards import ShardWeightedLoss


def hybrid_train_step(mesh: Mesh, model, loss_fn, optimizer, x: np.ndarray, target: np.ndarray) -> float:
    """One step of hybrid training on the whole batch (x, target), identical on every rank.

    ``model`` is built on ``mesh.group("tensor")`` (e.g. ``megatron_parallel_mlp(mesh.group("tensor"),
    full)``). Returns this row's share (B_j/B)·loss_j of the batch loss; summed over the rows it is the
    batch loss.
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a minidist.parallel.Mesh, got {type(mesh).__name__}")
    D = mesh.sizes["data"]
    if len(x) < D:
        raise ValueError(f"a batch of {len(x)} cannot be split over {D} data-parallel rows: each row needs "
                         f"at least one sample")
    lo, hi = split_range(len(x), D, mesh.coords["data"])
    share = (hi - lo) / len(x)
    optimizer.zero_grad()
    sync = GradientSync(model, mesh.group("data"), overlap=False)       # the column's sum, after backward
    runner = StepRunner(model, ShardWeightedLoss(loss_fn, share), [sync])
    loss = runner.forward_backward(x[lo:hi], target[lo:hi])
    optimizer.step()
    return loss * share


def mesh_bytes_sent(mesh: Mesh) -> int:
    """Payload bytes this rank has sent over the mesh's communicator and its data and tensor groups (each
    split communicator keeps its own counters in ``stats``)."""
    return sum(c.stats.bytes_sent for c in (mesh.comm, mesh.group("tensor"), mesh.group("data")))
