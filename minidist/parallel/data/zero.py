"""ZeRO stages 1 and 2: data parallelism whose optimizer state (and gradients) are sharded over the ranks.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models". Every rank
still holds all Ψ parameters (b bytes each) and computes the full gradient of its slice of the batch, but
the optimizer updates only its piece of each bucket (flat.py), so K bytes of optimizer state per
parameter become K/P:

    DataParallel   (b + b + K) Ψ            allreduce = reduce-scatter + allgather: 2(P − 1)/P · bΨ sent
    ZeRO-1         (b + b) Ψ + K Ψ_r        reduce-scatter the gradients, update the shard, allgather it
    ZeRO-2         b Ψ + (b + K) Ψ_r        the same, but each bucket's full gradient is freed as soon as
                                            backward has produced it and it is reduce-scattered
with Ψ_r = Σ over buckets of the rank's piece (Ψ/P when P divides every bucket); bytes sent are
data parallelism's. Stage 3 (parameters sharded too) is FSDP in fsdp.py.

    zero = ZeRO(comm, model, lambda shards: Adam(shards, lr=1e-3), CrossEntropyLoss(), stage=2)
    loss = zero.train_step(x, y)      # x, y: the global batch, the same on every rank
"""

from __future__ import annotations

import numpy as np

from .buckets import DEFAULT_BUCKET_BYTES, assign_buckets, ready_layers
from .flat import zero1_shard_update  # noqa: F401  (the exercise's function, in flat.py)
from .fsdp import FSDP
from .sharded import ShardedWrapper
from .zero_mixed import ShardedMixedPrecision


class ZeRO(ShardedWrapper):
    """ZeRO stage 1 or 2 over the ranks of ``comm`` (stage 3: FSDP).

    Args:
        comm: the Communicator; model: a minidist Module (the same values on every rank).
        make_optimizer: a function [Parameter] -> optimizer, called once with this rank's shards
            (e.g. ``lambda shards: SGD(shards, lr=0.1, momentum=0.9)``); element-wise optimizers only.
        loss_fn: e.g. CrossEntropyLoss().
        stage: 1 (optimizer state sharded) or 2 (gradients sharded too).
        bucket_bytes: gradients travel in buckets of about this many bytes (buckets.py); each bucket is one
            group, cut in P pieces.
        memory: a MemoryLedger to record held bytes at each point of a step (None: no recording).
        mixed: a ShardedMixedPrecision (zero_mixed.py): low-precision parameters and gradients, fp32
            master shards; float32 models only. None: plain precision.
    """

    def __init__(self, comm, model, make_optimizer, loss_fn, *, stage: int = 1,
                 bucket_bytes: int | None = DEFAULT_BUCKET_BYTES, algorithm: str = "ring", memory=None,
                 mixed: ShardedMixedPrecision | None = None):
        if stage not in (1, 2) or isinstance(stage, bool):
            raise ValueError(f"ZeRO stage must be 1 or 2 (stage 3 is FSDP, fsdp.py), got {stage!r}")
        super().__init__(comm, model, make_optimizer, loss_fn, algorithm, memory, mixed)
        self.stage = stage
        completes = ready_layers(self.layers, assign_buckets(model.parameters(), bucket_bytes))
        self._attach(make_optimizer, {}, {i: f"backward layer {i}" for i in sorted(set(completes))},
                     bucket_bytes=bucket_bytes)

    # -- one global batch --------------------------------------------------------------------------------
    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward on this rank's shard of the global batch, then the sharded update: stage 1
        reduce-scatters, steps and allgathers now (zero1_shard_update), stage 2 reduce-scattered each
        bucket during backward (zero_sync.py).

        x: the global batch (B, ...), the same on every rank, P <= B; y: its targets (B, ...).
        Returns this rank's mean loss over its shard.
        """
        if self.stage == 1:
            for g in self.groups:
                g.grad[...] = 0
        loss = self._forward_backward(x, y)
        self._update()
        return loss

    # -- what a rank holds ----------------------------------------------------------------------------------
    def full_parameters(self) -> list[np.ndarray]:
        """Copies of the full parameters, in model.parameters() order (every rank holds them)."""
        return [p.data.copy() for p in self.model.parameters()]

    def bytes_per_step(self, applied: bool = True) -> int:
        """Bytes this rank sends per step: a reduce-scatter and an allgather of every bucket (flat.py); with
        mixed precision also the found_inf flag, and no allgather when the step was skipped."""
        return self._bytes_sent(allgathers=int(applied))


def zero_data_parallel(comm, model, make_optimizer, loss_fn, *, stage: int, **options):
    """ZeRO(stage=1 or 2) or FSDP (stage=3) with the same arguments; any other stage is a ValueError."""
    if isinstance(stage, bool) or stage not in (1, 2, 3):
        raise ValueError(f"ZeRO stage must be 1, 2 or 3, got {stage!r}")
    if stage == 3:
        options.pop("bucket_bytes", None)       # FSDP's unit is the layer
        return FSDP(comm, model, make_optimizer, loss_fn, **options)
    return ZeRO(comm, model, make_optimizer, loss_fn, stage=stage, **options)
