"""ZeroSync: the step-runner attachment of ZeRO stages 1-3 — reduce-scatter, the sharded step, the gathers.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models". On
GradientReadiness (buckets.py: when a gradient is ready, its partial sums taken). The parameters are cut
into flat groups (flat.py: a bucket for stages 1-2, one unit's parameters for stage 3); rank r owns the
piece [lo, hi) of each, its *shard*, and the optimizer is built on the shards only:

    stage 1   step():              shard.grad = piece r of reduce_scatter(g), step the shards, allgather
                                   them into the parameters (flat.zero1_shard_update)
    stage 2   bucket ready:        shard.grad = piece r of reduce_scatter(g_b); g_b freed
              step():              step the shards, allgather them into the parameters
    stage 3   unit i's forward and backward: allgather W_i before, free it after
              unit ready:          shard.grad = piece r of reduce_scatter(dW_i); dW_i freed
              step():              step the shards (the next forward gathers them)

``mixed`` (zero_mixed.py): fp32 master shards that the low-precision parameters follow; the ranks of
``data`` agree on found_inf at step(). Every rank ends with bitwise the same parameters (trainer: zero.py).
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from minidist.collectives import allgather, reduce_scatter
from minidist.nn.module import Module, Parameter

from ..shards import check_communicator
from . import flat
from .buckets import DEFAULT_BUCKET_BYTES, Bucket, GradientReadiness, assign_buckets, ready_layers
from .zero_mixed import check_mixed


class ZeroSync(GradientReadiness):
    """ZeRO stage 1, 2 or 3 of ``model`` over the replicas ``data`` (see the module docstring).

    Args:
        model: the Module whose parameters this rank trains (a whole model or a pipeline stage's module).
        data: the Communicator over the data-parallel replicas (the ring's reduce-scatter and allgather).
        stage: 1 (optimizer state sharded), 2 (gradients too) or 3 (parameters too: FSDP).
        make_optimizer: a function [Parameter] -> optimizer, called once with this rank's shards;
            element-wise optimizers only (flat.build_optimizer checks).
        bucket_bytes: stages 1-2: the groups are buckets of about this many bytes (stage 3: one per unit).
        mixed: a ShardedMixedPrecision (zero_mixed.py; stage 3 keeps a low-precision shard ``g.low``,
            gathered before use). None: plain precision.
    """

    def __init__(self, model: Module, data, *, stage: int, make_optimizer,
                 bucket_bytes: int | None = DEFAULT_BUCKET_BYTES, mixed=None):
        super().__init__(model)
        check_communicator("data", data, optional=False)
        if isinstance(stage, bool) or stage not in (1, 2, 3):
            raise ValueError(f"stage must be a ZeRO stage 1, 2 or 3, got {stage!r}")
        self.data, self.stage, self.precision = data, stage, check_mixed(mixed)
        self.precision.bind(model, self.params)                 # mixed: float32 parameters, once
        holding = [i for i, u in enumerate(self.units) if u.parameters()]
        if stage == 3:                                           # FSDP's unit: one unit's parameters
            buckets = [Bucket(k, self.units[i].parameters()) for k, i in enumerate(holding)]
        else:
            buckets = assign_buckets(self.params, bucket_bytes)
            ready_layers(self.units, buckets)                    # every parameter belongs to a unit
        self.watch(buckets)
        p, r = data.world_size, data.rank
        self.groups = [flat.ShardGroup(b.params, r, p) for b in self.buckets]     # groups[b.index]: b's
        self.group_of = {id(q): g for g in self.groups for q in g.params}
        # ZeRO-3: the group of the runner's i-th unit, by position (a model may build new unit objects on
        # each call of ``units()``, as a GPT does its input)
        self.group_at = dict(zip(holding, self.groups)) if stage == 3 else {}
        for g in self.groups:
            piece = g.data[g.lo:g.hi]
            g.shard = Parameter(piece.copy() if stage == 3 else self.precision.master(piece))
        self.optimizer = flat.build_optimizer(make_optimizer, [g.shard for g in self.groups])
        for g in self.groups:                              # only now: a refused optimizer changed nothing
            if stage == 3:
                g.free_data()
                g.free_grad()
                continue
            g.data = self.precision.working(g.data)       # mixed: the parameters live in low precision
            g.bind_data(g.data)                           # the parameters become views of the flat vector
            if stage == 1:
                g.bind_grad(np.zeros(g.n, dtype=g.dtype))
                g.shard.grad = g.grad[g.lo:g.hi]
            else:
                g.free_grad()                              # allocated bucket by bucket during backward
        if stage == 3:
            self.share_masters()

    # -- stage 3: a unit's parameters exist only while it runs -----------------------------------------------
    def _gather(self, g: flat.ShardGroup) -> None:
        g.bind_data(np.concatenate(allgather(self.data, g.low)))

    def before_forward(self, i, unit, x):
        g = self.group_at.get(i)
        if g is not None:
            self._gather(g)
        return x

    def after_forward(self, i, unit, y):
        g = self.group_at.get(i)
        if g is not None:
            g.free_data()
        return y

    def before_backward(self, i, unit, dy):
        """Stages 2-3: the full gradient exists only while backward makes it (stage 3: gather W_i)."""
        if self.stage >= 2:
            for p in self.params_of(unit):
                g = self.group_of[id(p)]
                if self.stage == 3 and g.data is None:
                    self._gather(g)
                if g.grad is None:
                    g.bind_grad(np.zeros(g.n, dtype=g.dtype))
        return dy

    def after_backward(self, i, unit, dx):
        """Stage 3: free W_i (its gradient stays until reduce-scattered); then the readiness bookkeeping."""
        g = self.group_at.get(i)
        if g is not None:
            g.free_data()
        return super().after_backward(i, unit, dx)

    # -- readiness: reduce-scatter a group as it completes ---------------------------------------------------
    def bucket_complete(self, bucket: Bucket) -> None:
        if self.stage >= 2:
            self._reduce_scatter(self.groups[bucket.index])

    def backward_complete(self, incomplete: list[Bucket]) -> None:
        """Stage 2: the buckets not complete in backward (an empty pass: a table's W tasks made them)."""
        if self.stage == 2:
            for bucket in incomplete:
                self._reduce_scatter(self.groups[bucket.index])

    def _reduce_scatter(self, g: flat.ShardGroup) -> None:
        """shard.grad = piece r of Σ_ranks g.grad; the full gradient freed."""
        g.shard.grad[...] = reduce_scatter(self.data, g.grad)
        g.free_grad()

    # -- the sharded step ------------------------------------------------------------------------------------
    def step(self) -> bool:
        """The module docstring's step(); in plain precision stage 1 is the exercise flat.zero1_shard_update.
        False if skipped (Inf/NaN)."""
        if self.stage == 1 and not self.precision.keeps_masters:
            flat.zero1_shard_update(self.data, self.groups, self.optimizer)
            return True
        if self.stage == 1:                                  # mixed: into the fp32 master shards' .grad
            for g in self.groups:
                g.shard.grad[...] = reduce_scatter(self.data, g.grad)
        applied = self.precision.step(self.data, [g.shard for g in self.groups], self.optimizer)
        if applied:
            self.share_masters()
        return applied

    def share_masters(self) -> None:
        """Stages 1-2: allgather the updated shards into the parameters (mixed: quantized to fmt);
        stage 3: each rank's working shard ``g.low``, gathered before use."""
        for g in self.groups:
            if self.stage == 3:
                g.low = self.precision.working(g.shard.data)
            else:
                g.data[...] = np.concatenate(allgather(self.data, self.precision.working(g.shard.data)))

    @contextmanager
    def gathered(self):
        """Stage 3: every unit's full parameters gathered for the ``with`` block (a collective: every rank of
        the data group enters it), freed after; stages 1-2 hold them anyway."""
        groups = self.groups if self.stage == 3 else []
        for g in groups:
            self._gather(g)
        yield                                  # (an error inside ends the run: nothing to free then)
        for g in groups:
            g.free_data()
