"""Data parallelism in its plainest form: backward, then one allreduce per parameter — read this first.

"Distributed Deep Learning (Part II)" slides, "Synchronous Data Parallelism": every rank holds the whole
model and computes on its slice of the global batch, the gradients are allreduced, every rank applies
the same update:

    w¹ = w⁰ − α/B · Σ_{i=1..B} ∂J_i(w⁰)/∂w          rank r backpropagates Σ_{i∈r} ℓ_i / B, so the
                                                     allreduce *sum* over ranks is the full-batch gradient

The whole strategy is two events of the step runner (minidist/nn/runner.py): ``after_loss`` weights the
loss gradient by n_r / B; at ``end_backward`` every gradient is ready and is allreduced, parameter by
parameter. Cost per step: one allreduce per parameter tensor, α·(steps of the algorithm) each, and no
overlap with backward. data_parallel.py's DataParallel packs the gradients into buckets and sends each as
soon as backward has made it (PyTorch's DDP).

    dp = NaiveDataParallel(comm, model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss())
    loss = dp.train_step(x, y)           # x, y: the global batch, the same on every rank
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import allreduce
from minidist.nn.module import Module
from minidist.nn.runner import Attachment, StepRunner

from ..shards import shard_range


class NaiveDataParallel(Attachment):
    """Train ``model`` with ``optimizer`` and ``loss_fn`` data-parallel over the ranks of ``comm``.

    The replicas must start identical (the same seed on every rank); ``algorithm`` is the allreduce's.
    """

    def __init__(self, comm, model: Module, optimizer, loss_fn, *, algorithm: str = "ring"):
        self.comm, self.optimizer, self.algorithm = comm, optimizer, algorithm
        self.params, self.weight = model.parameters(), 1.0
        self.runner = StepRunner(model, loss_fn, [self])

    def after_loss(self, dy: np.ndarray) -> np.ndarray:
        """dL/dy of this rank's mean loss, weighted by n_r / B: the ranks' gradients then *sum* to the
        gradient of the batch mean."""
        return dy * self.weight

    def end_backward(self) -> None:
        """Every gradient is ready: sum each over the ranks (in place)."""
        for p in self.params:
            allreduce(self.comm, p.grad, op="sum", algorithm=self.algorithm, out=p.grad)

    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """x: the global batch (B, ...), P <= B; y: its targets (B, ...). Returns this rank's mean loss."""
        lo, hi = shard_range(self.comm, x, y)
        self.weight = (hi - lo) / len(x)
        self.optimizer.zero_grad()
        loss = self.runner.forward_backward(x[lo:hi], y[lo:hi])     # end_backward allreduces
        self.optimizer.step()
        return loss
