"""GradientSync: the one step-runner attachment that makes every replica's gradient the full gradient.

Keyed by parameter: ``after_backward(i, unit, dx)`` says "unit.parameters() are ready", so the same
attachment serves a whole model's runner and a pipeline stage's (whose units are another model's). For
each parameter p, once its last unit of the step's last backward pass is done (``begin_backward(last)``):

    partial sums    for c in p.partial_over:  p.grad = Σ_c p.grad        (tensor / sequence / context splits)
    data replicas   zero=0   buckets of reverse parameter order, each allreduced when complete (comm.py;
                             overlap=False: all at end_backward; ``clock``: after compute, overlap.py)
                    zero=1   at step(): reduce-scatter, update this rank's shard, allgather (zero.py)
                    zero=2   each bucket reduce-scattered when complete, its full gradient freed (zero.py)
                    zero=3   a unit's parameters gathered before its forward/backward, freed after, its
                             gradient reduce-scattered (fsdp.py)
    overflow        mixed precision: found_inf agreed (allreduce max) over ``inf_group`` (default: data) at
                    the end of backward; a wider group (every stage of a pipeline) at step()

The data reduction is a SUM: each replica backpropagates (n_r / B)·mean_r(ℓ) (shards.ShardWeightedLoss), so
Σ_r g_r is the full-batch gradient (data_parallel.py); every rank ends with bitwise the same sums.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from minidist.collectives import allgather, allreduce, pairwise_allreduce, reduce_scatter, shared_empty
from minidist.nn.flat import flatten, views
from minidist.nn.module import Module, Parameter
from minidist.nn.runner import Attachment, units

from . import flat
from .comm import DEFAULT_BUCKET_BYTES, Bucket, allreduce_bucket, assign_buckets, ready_layers
from .zero_mixed import check_mixed


class GradientSync(Attachment):
    """Synchronise the gradients of ``model``'s parameters (see the module docstring).

    Args:
        model: the Module whose parameters this rank trains (a whole model or a pipeline stage's module).
        data: the Communicator over the data-parallel replicas (None: no data reduction).
        zero: 0 (allreduce) or ZeRO stage 1, 2, 3; zero >= 1 needs ``make_optimizer`` and data.
        algorithm: the allreduce algorithm (zero=0); sharded stages use the ring's reduce-scatter.
        bucket_bytes: bucket capacity (DDP's 25 MiB); None: one bucket per parameter.
        overlap: zero=0: allreduce each bucket as soon as it is complete (else at end_backward).
        mixed: zero=0: the MixedPrecisionTrainer in the same runner; zero >= 1: a ShardedMixedPrecision.
        inf_group: where ranks agree on a mixed-precision overflow (default: data).
        clock: a minidist.sim.compute.ComputeCharges: each allreduce first waits for the compute stream.
        gradient_as_bucket_view: every .grad becomes a view of its bucket's buffer (zero=0).
        make_optimizer: zero >= 1: a function [Parameter] -> optimizer, called with this rank's shards.
    """

    def __init__(self, model: Module, data=None, *, zero: int = 0, algorithm: str = "ring",
                 bucket_bytes: int | None = DEFAULT_BUCKET_BYTES, overlap: bool = True, mixed=None,
                 inf_group=None, clock=None, gradient_as_bucket_view: bool = False, make_optimizer=None):
        if not isinstance(model, Module):
            raise TypeError(f"model must be a minidist Module, got {type(model).__name__}")
        for name, comm in (("data", data), ("inf_group", inf_group)):
            if comm is not None and not (hasattr(comm, "rank") and hasattr(comm, "world_size")):
                raise TypeError(f"{name} must be a Communicator or None, got {type(comm).__name__}")
        if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be 0 (allreduce) or a ZeRO stage 1, 2, 3, got {zero!r}")
        if zero and (data is None or make_optimizer is None):
            raise ValueError("a ZeRO stage needs data= (the replicas' Communicator) and make_optimizer=")
        if zero and algorithm != "ring":
            raise ValueError("sharded data parallelism uses ring reduce_scatter/allgather; got algorithm "
                             f"{algorithm!r}")
        self.model, self.data, self.zero, self.algorithm = model, data, zero, algorithm
        self.overlap, self.clock, self.mixed = bool(overlap), clock, mixed
        self.inf_group = inf_group if inf_group is not None else data
        self.params = model.parameters()
        self.units = units(model)
        self._uses = {id(p): 0 for p in self.params}            # units a parameter belongs to (tied: 2)
        for unit in self.units:
            for p in unit.parameters():
                self._uses[id(p)] = self._uses.get(id(p), 0) + 1
        self._unit_params: dict[int, list[Parameter]] = {}
        self.found_inf, self._last = False, True
        if zero == 3:                                            # FSDP's unit: one unit's parameters
            self.buckets = [Bucket(k, u.parameters()) for k, u in enumerate(u for u in self.units
                                                                            if u.parameters())]
        else:
            self.buckets = assign_buckets(self.params, bucket_bytes)
            ready_layers(self.units, self.buckets)               # every parameter belongs to a unit
        self.bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.gradient_as_bucket_view = (bool(gradient_as_bucket_view) and zero == 0 and data is not None
                                        and data.world_size > 1)
        if self.gradient_as_bucket_view:
            for bucket in self.buckets:      # in the cluster's shared memory where it has room: see _issue
                bucket.buffer = flatten([p.grad for p in bucket.params],
                                        out=shared_empty(data, bucket.size, self.params[0].grad.dtype))
                for p, view in zip(bucket.params, views(bucket.buffer, [p.shape for p in bucket.params])):
                    p.grad = view
        if zero:
            self._shard(make_optimizer)
        self.begin_backward(True)

    # -- which parameters are ready -------------------------------------------------------------------------
    def params_of(self, unit: Module) -> list[Parameter]:
        """unit.parameters(), looked up once per unit."""
        found = self._unit_params.get(id(unit))
        if found is None:
            found = self._unit_params[id(unit)] = unit.parameters()
        return found

    def begin_backward(self, last: bool) -> None:
        self._last = bool(last)
        if self._last:
            self._left = dict(self._uses)
            self._waiting = {b.index: len(b.params) for b in self.buckets}
            self._sent = set()

    def before_backward(self, i, unit, dy):
        if self.zero >= 2:                            # the full gradient exists only while it is reduced
            for p in self.params_of(unit):
                g = self.bucket_of[id(p)].group
                if self.zero == 3 and g.data is None:
                    self._gather(g)
                if g.grad is None:
                    g.bind_grad(np.zeros(g.n, dtype=g.dtype))
        return dy

    def after_backward(self, i, unit, dx):
        """unit's parameters' gradients are ready: sum the partial ones, send the buckets they complete."""
        if self.zero == 3:
            g = self._group_at(i)
            if g is not None:
                g.free_data()
        if not self._last:
            return dx
        ready = []
        for p in self.params_of(unit):
            self._left[id(p)] -= 1
            if self._left[id(p)] == 0:
                ready.append(p)
        self.sum_partial(ready)
        complete = []
        for p in ready:
            bucket = self.bucket_of[id(p)]
            self._waiting[bucket.index] -= 1
            if self._waiting[bucket.index] == 0:
                complete.append(bucket)
        if self.zero >= 2 or self.zero == 0 and self.overlap:
            for bucket in sorted(complete, key=lambda b: b.index):     # in bucket order, as DDP issues them
                self._issue(bucket)
        return dx

    def end_backward(self) -> None:
        """The step's last pass is done: send what is left (overlap=False: every bucket), then agree on an
        overflow (zero=0; the sharded stages agree at step())."""
        if self._last:
            self.sync_now()

    def sync_now(self) -> None:
        """Sum the partial gradients not summed yet (an empty pass: a table's W tasks made them), send every
        bucket not sent yet (zero=0, 2) and, zero=0, agree on found_inf."""
        self.sum_partial([p for p in self.params if self._left[id(p)] > 0])
        self._left = dict.fromkeys(self._left, 0)
        for bucket in self.buckets:
            if bucket.index not in self._sent and self.zero in (0, 2):
                self._issue(bucket)
        if self.zero == 0 and self.mixed is not None and self.inf_group is self.data:
            self._agree()

    def _agree(self) -> None:
        """Mixed precision: round the sums to grad_fmt, unscale, agree on found_inf over inf_group."""
        group = self.inf_group
        self.found_inf = self.mixed.agree(lambda flag: flag if group is None else
                                          allreduce(group, flag, op="max", algorithm=self.algorithm))

    def sum_partial(self, params: list[Parameter]) -> None:
        """p.grad = Σ over each c in p.partial_over, one flat pairwise_allreduce per Communicator."""
        groups: dict[int, tuple] = {}
        for p in params:
            for c in p.partial_over:
                groups.setdefault(id(c), (c, []))[1].append(p)
        for c, ps in groups.values():
            if c.world_size > 1:
                total = pairwise_allreduce(c, flatten([p.grad for p in ps]))
                for p, piece in zip(ps, views(total, [p.grad.shape for p in ps])):   # (ZeRO-3: data freed)
                    p.grad[...], p.partial_pending = piece, False    # summed: an optimizer may step on it

    # -- the data reduction ----------------------------------------------------------------------------------
    def _issue(self, bucket) -> None:
        self._sent.add(bucket.index)
        if self.zero == 2:
            g = bucket.group                               # complete: reduce-scatter it, free it
            g.shard.grad[...] = reduce_scatter(self.data, g.grad)
            g.free_grad()
            return
        if self.zero == 3:
            g = bucket.group
            g.shard.grad = reduce_scatter(self.data, g.grad)   # piece r of Σ_ranks dW_l
            g.free_grad()
            return
        if self.clock is not None:
            self.clock.wait_until(self.clock.ready(), f"backward until bucket {bucket.index} is ready")
        if self.data is None or self.data.world_size == 1:   # a sum over one rank changes nothing
            return
        if self.gradient_as_bucket_view:                 # the gradients already lie in the buffer, in order
            if not all(p.grad.base is bucket.buffer for p in bucket.params):
                raise ValueError("gradient_as_bucket_view: a Parameter.grad was replaced by a new array; "
                                 "layers and optimizers must update .grad in place")
            allreduce(self.data, bucket.buffer, op="sum", algorithm=self.algorithm, out=bucket.buffer)
            return
        if bucket.buffer is None:       # the peers of algorithm="shared_memory" reduce straight out of it
            bucket.buffer = shared_empty(self.data, bucket.size, self.params[0].grad.dtype)
        allreduce_bucket(self.data, [p.grad for p in bucket.params], self.algorithm, bucket.buffer)

    # -- ZeRO: shards of flat groups (flat.py) ---------------------------------------------------------------
    def _shard(self, make_optimizer) -> None:
        """One ShardGroup per bucket (zero=1, 2) or unit (zero=3); the optimizer on this rank's shards."""
        self.precision = check_mixed(self.mixed)
        self.comm = self.data                              # the name zero_mixed's steps read
        p, r = self.data.world_size, self.data.rank
        for b in self.buckets:
            b.group = flat.ShardGroup(b.params, r, p)
            piece = b.group.data[b.group.lo:b.group.hi]
            b.group.shard = Parameter(piece.copy() if self.zero == 3 else self.precision.master(piece))
        self.groups = [b.group for b in self.buckets]
        holding = [i for i, u in enumerate(self.units) if u.parameters()]      # the units with a bucket
        self._group_by_index = {i: b.group for i, b in zip(holding, self.buckets)} if self.zero == 3 else {}
        self.optimizer = flat.build_optimizer(make_optimizer, [g.shard for g in self.groups])
        for g in self.groups:                              # only now: a refused optimizer changed nothing
            if self.zero == 3:
                g.free_data()
                g.free_grad()
                continue
            g.data = self.precision.working(g.data)       # mixed: the parameters live in low precision
            g.bind_data(g.data)                           # the parameters become views of the flat vector
            if self.zero == 1:
                g.bind_grad(np.zeros(g.n, dtype=g.dtype))
                g.shard.grad = g.grad[g.lo:g.hi]
            else:
                g.free_grad()                              # allocated bucket by bucket during backward
        if self.zero == 3:
            self.share_masters()

    def _group_at(self, i: int):
        """ZeRO-3: the shard group of the runner's i-th unit (by position: a model may build new unit objects
        on each call of ``units()``, as a GPT does its input), or None for a unit without parameters."""
        return self._group_by_index.get(i)

    def _gather(self, g: flat.ShardGroup) -> None:
        g.bind_data(np.concatenate(allgather(self.data, g.low)))

    def before_forward(self, i, unit, x):
        g = self._group_at(i) if self.zero == 3 else None
        if g is not None:
            self._gather(g)
        return x

    def after_forward(self, i, unit, y):
        g = self._group_at(i) if self.zero == 3 else None
        if g is not None:
            g.free_data()
        return y

    def step(self) -> bool:
        """ZeRO: update this rank's shards from its piece of the summed gradient (zero=1: reduce-scatter
        first, the exercise zero1_shard_update), then the parameters follow. zero=0: ``mixed.step`` with
        the agreed found_inf. Returns False if the step was skipped (Inf/NaN)."""
        if self.zero == 0:
            if not callable(getattr(self.mixed, "step", None)):
                raise ValueError("GradientSync.step() with zero=0 steps mixed= (a MixedPrecisionTrainer); "
                                 "without one, step your optimizer")
            if self.inf_group is not self.data:      # a wider group (a pipeline's stages): now, not in B
                self._agree()
            return self.mixed.step(self.found_inf)
        if self.zero == 1:
            return self.precision.zero1_step(self)
        return self._update()

    def _update(self) -> bool:
        self.applied = self.precision.step(self.data, [g.shard for g in self.groups], self.optimizer)
        if self.applied:
            self.share_masters()
        return self.applied

    @contextmanager
    def gathered(self):
        """ZeRO-3: every unit's full parameters gathered for the ``with`` block (a collective: every rank of
        the data group enters it), freed after; other stages hold them anyway."""
        groups = self.groups if self.zero == 3 else []
        for g in groups:
            self._gather(g)
        yield                                  # (an error inside ends the run: nothing to free then)
        for g in groups:
            g.free_data()

    def share_masters(self) -> None:
        """zero=1, 2: allgather the updated shards into the parameters (mixed: quantized to fmt);
        zero=3: each rank's working shard ``g.low``, gathered before use."""
        for g in self.groups:
            if self.zero == 3:
                g.low = self.precision.working(g.shard.data)
            else:
                g.data[...] = np.concatenate(allgather(self.data, self.precision.working(g.shard.data)))

