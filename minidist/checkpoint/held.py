"""held_by(comm, model, optimizer): save / load for runs not built by parallelize — DataParallel (each rank
a whole replica), the Pipeline executor (each rank its stages' parameters), one process.

The Trainer labels its elements before splitting (compose/state.py); here nothing is split, so parameter k
of ``model.named_parameters()`` holds the labels [start_k, start_k + size_k) and an optimizer parameter is
labelled by which of the model's parameters it is. Every rank builds the whole model (as DataParallel and
the Pipeline want), so any of these runs, or a parallelized one of the same model, can take the files.

    from minidist.checkpoint import held_by, save, load
    save(held_by(dp.comm, dp.model, dp.optimizer), root, step)                  # DataParallel
    save(held_by(comm, model, optimizer), root, step)      # a Pipeline: optimizer on pipe.parameters()
"""

from __future__ import annotations

import numpy as np


class HeldParameters:
    """What save and load read of a Trainer, for a model held whole (or by its own parameters) on each
    rank: mesh (comm, sizes), model, named [(name, parameter, values)], held / labels (the optimizer's
    parameters and their labels), optimizer, zero = 0, seq_len = None."""

    def __init__(self, comm, model, optimizer):
        self.mesh = _Ranks(comm)
        self.model, self.optimizer, self.units = model, optimizer, model
        self.zero, self.seq_len, self.recipe, self.mixed = 0, None, None, None
        self.named, start, where = [], 0, {}
        for name, p in model.named_parameters():
            self.named.append((name, p, p.data))
            where[id(p)] = np.arange(start, start + p.size)
            start += p.size
        missing = [i for i, p in enumerate(optimizer.params) if id(p) not in where]
        if missing:
            raise ValueError(f"optimizer.params[{missing[0]}] is not a parameter of the model: build the "
                             "optimizer on the model's parameters (a Pipeline: on pipeline.parameters())")
        self.held = list(optimizer.params)
        self.labels = [where[id(p)] for p in self.held]

    def prepare(self, seq_len) -> None:
        """Nothing to build: the model is not split."""


class _Ranks:
    def __init__(self, comm):
        self.comm = _Alone() if comm is None else comm
        self.sizes = {"data": self.comm.world_size, "context": 1}


class _Alone:
    """One process, no cluster: rank 0 of 1 (its barrier has no one to wait for)."""
    rank, world_size = 0, 1

    def barrier(self) -> None:
        pass


def held_by(comm, model, optimizer) -> HeldParameters:
    """The handle save and load take for ``model`` and its ``optimizer`` on this rank of ``comm`` (None: one
    process outside a cluster, e.g. to read a checkpoint into an unsplit model)."""
    return HeldParameters(comm, model, optimizer)
