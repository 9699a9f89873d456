"""GradientSync: the step-runner attachment of data parallelism (DDP) — each bucket allreduced when ready.

On GradientReadiness (buckets.py: when a gradient is ready, its partial sums taken), as PyTorch's DDP:

    buckets         the parameters in reverse order, ~bucket_bytes each (buckets.py)
    bucket ready    overlap=True: g_b = Σ_r g_b,r now, one allreduce of its flat buffer (the simulated
                    ``clock`` first waits for the compute stream: overlap.py); overlap=False: at end_backward
    end_backward    the buckets not sent yet; mixed precision: round the sums to grad_fmt, unscale, agree on
                    found_inf (allreduce max) over ``inf_group`` (default: data; a wider group, every stage
                    of a pipeline: at step())

The reduction is a SUM of gradients weighted n_r / B (shards.ShardWeightedLoss: naive.py says why); every
rank ends with bitwise the same sums. With data=None only the partial sums run (a split model without
replicas). ZeRO's sharded sync: zero_sync.py.
"""

from __future__ import annotations

from minidist.collectives import allreduce, shared_empty
from minidist.collectives.allreduce import check_algorithm
from minidist.nn.flat import flatten, views
from minidist.nn.module import Module

from ..shards import check_communicator
from .buckets import DEFAULT_BUCKET_BYTES, GradientReadiness, allreduce_bucket, assign_buckets, ready_layers


class GradientSync(GradientReadiness):
    """Allreduce ``model``'s gradients over the data replicas, bucket by bucket (see the module docstring).

    Args:
        model: the Module whose parameters this rank trains (a whole model or a pipeline stage's module).
        data: the Communicator over the data-parallel replicas (None: the partial sums only).
        algorithm: the allreduce algorithm ("ring", "tree", ..., "hierarchical" or "torus" under
            ``run(..., link=Topology(...))``, "shared_memory" (the peers reduce straight out of the buckets
            in the cluster's shared memory), or "auto", chosen by topology and size).
        bucket_bytes: bucket capacity in bytes (DDP's default 25 MiB); None: one allreduce per parameter.
        overlap: allreduce each bucket as soon as it is complete (else all at end_backward).
        mixed: the MixedPrecisionTrainer (or FullPrecision) in the same runner: found_inf is agreed.
        inf_group: where ranks agree on a mixed-precision overflow (default: data).
        clock: a minidist.sim.compute.ComputeCharges: each allreduce first waits for the compute stream.
        gradient_as_bucket_view: make every Parameter.grad a view into its bucket's flat buffer (as
            PyTorch's DDP option of that name), so no flatten and copy-back is needed (layers must *add*
            into .grad in place, as every minidist layer does; a replaced .grad is detected).
    """

    def __init__(self, model: Module, data=None, *, algorithm: str = "ring",
                 bucket_bytes: int | None = DEFAULT_BUCKET_BYTES, overlap: bool = True, mixed=None,
                 inf_group=None, clock=None, gradient_as_bucket_view: bool = False):
        check_algorithm(algorithm)
        super().__init__(model)
        check_communicator("data", data)
        check_communicator("inf_group", inf_group)
        self.data, self.algorithm, self.overlap, self.clock, self.mixed = data, algorithm, bool(overlap), \
            clock, mixed
        self.inf_group = inf_group if inf_group is not None else data
        self.found_inf = False
        buckets = assign_buckets(self.params, bucket_bytes)
        ready_layers(self.units, buckets)                        # every parameter belongs to a unit
        self.watch(buckets)
        self.gradient_as_bucket_view = (bool(gradient_as_bucket_view) and data is not None
                                        and data.world_size > 1)
        if self.gradient_as_bucket_view:
            for bucket in self.buckets:       # in the cluster's shared memory where it has room: see _send
                bucket.buffer = flatten([p.grad for p in bucket.params],
                                        out=shared_empty(data, bucket.size, self.params[0].grad.dtype))
                for p, view in zip(bucket.params, views(bucket.buffer, [p.shape for p in bucket.params])):
                    p.grad = view

    # -- readiness: a bucket is ready, or backward is over ---------------------------------------------------
    def bucket_complete(self, bucket) -> None:
        if self.overlap:
            self._send(bucket)

    def backward_complete(self, incomplete) -> None:
        """Send what is left (overlap=False: every bucket), then agree on an overflow."""
        for bucket in incomplete if self.overlap else self.buckets:
            self._send(bucket)
        if self.mixed is not None and self.inf_group is self.data:
            self._agree()

    def _send(self, bucket) -> None:
        """g = Σ over data of the bucket's gradients, in place: one allreduce of one flat buffer."""
        if bucket.delayed:                               # DelayedUpdate sends it during the next forward
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

    # -- mixed precision: the agreed overflow ----------------------------------------------------------------
    def _agree(self) -> None:
        """Round the sums to grad_fmt, unscale, agree on found_inf (max) over inf_group."""
        group = self.inf_group
        self.found_inf = self.mixed.agree(lambda flag: flag if group is None else
                                          allreduce(group, flag, op="max", algorithm=self.algorithm))

    def step(self) -> bool:
        """``mixed.step`` with the agreed found_inf (a wider inf_group agrees now, not in backward).
        Returns False if the step was skipped (Inf/NaN)."""
        if not callable(getattr(self.mixed, "step", None)):
            raise ValueError("GradientSync.step() steps mixed= (a MixedPrecisionTrainer); without one, step "
                             "your optimizer")
        if self.inf_group is not self.data:
            self._agree()
        return self.mixed.step(self.found_inf)
