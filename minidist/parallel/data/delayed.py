"""The one-step-delayed update of the first layers: their all-reduce overlaps the next step's forward.

The seed ("Hiding Communication Latencies", after Lee, Jha, Agrawal, Choudhary and Liao, "Parallel Deep
Convolutional Neural Network Training by Exploiting the Overlapping of Computation and Communication",
HiPC 2017): "Gradient computation and parameter update at the first fully-connected layers are delayed to
the next mini-batch training", so that "all communications are hidden behind the computation".

Why the first layers: backward ends with them, so in DataParallel (buckets.py) their bucket is ready
only when there is no compute left to hide its all-reduce behind. Here that bucket is not sent at the end
of step t: it is all-reduced at the start of step t + 1, on the communication stream while the forward
runs on the compute stream, and applied at step t + 1's update. For the delayed parameters D:

    step t      θ_D ← update(θ_D, g_D(t − 1))        g_D(−1) = 0 (step 0 leaves SGD's θ_D where it is)
    the rest    θ   ← update(θ, g(t))                  as DataParallel

so the first layers train on a gradient one step stale (one process does the same: the tests). On the
clock, the step takes (overlap.step_time with ``delayed_seconds`` = the delayed bucket's all-reduce)

    T = max(3F, the communication stream's end),   the stream: C_D from the step's start, then each
        other bucket from max(its readiness, the previous one's end)

against T = 3F + C_1 without the delay, when the first layers' all-reduce C_1 is all that is exposed.

    dp = DataParallel(comm, model, optimizer, loss_fn)
    delayed = DelayedUpdate(dp, layers=1)     # attaches to dp's runner; dp.train_step as before

Plain precision only; gradient_as_bucket_view and models whose forward communicates are refused.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import allreduce
from minidist.nn.checks import is_count
from minidist.nn.runner import Attachment
from minidist.precision.mixed import FullPrecision

from ..sync_batchnorm import SyncBatchNorm
from .buckets import Bucket
from .data_parallel import DataParallel

__all__ = ["DelayedUpdate"]


class DelayedUpdate(Attachment):
    """Delay the update of ``dp``'s first ``layers`` units with parameters by one step (module docstring).

    Args:
        dp: a DataParallel (plain precision, gradient_as_bucket_view=False, no SyncBatchNorm); this
            attachment joins its runner, takes the first layers' parameters out of its buckets into one
            bucket of their own that the data attachment does not send, and puts the forward on the compute
            stream of its clock (sim.compute: ``streamed_forward``).
        layers: how many of the first units with parameters are delayed (1 ≤ layers < their number).

    Attributes: ``params`` (the delayed parameters, forward order), ``units`` (their units' indices),
    ``bucket`` (their Bucket), ``pending`` (this rank's unsummed gradient of the last step, flat, or None).
    """

    def __init__(self, dp: DataParallel, layers: int = 1):
        if not isinstance(dp, DataParallel):
            raise TypeError(f"DelayedUpdate: dp must be a DataParallel, got {type(dp).__name__}")
        weighted = [i for i, unit in enumerate(dp.sync.units) if unit.parameters()]
        if not is_count(layers) or layers >= len(weighted):
            raise ValueError(f"DelayedUpdate: layers must be an int in [1, {len(weighted) - 1}] (the model "
                             f"has {len(weighted)} units with parameters, one must stay undelayed), got "
                             f"{layers!r}")
        if not isinstance(dp.precision, FullPrecision):
            raise ValueError("DelayedUpdate: dp must train in plain precision (mixed=None); its overflow "
                             "check would miss the delayed gradients")
        if dp.sync.gradient_as_bucket_view:
            raise ValueError("DelayedUpdate: dp must not use gradient_as_bucket_view=True (its buckets "
                             "are laid out already); build it with gradient_as_bucket_view=False")
        if any(isinstance(m, SyncBatchNorm) for m in dp.model.modules()):
            raise ValueError("DelayedUpdate: the model's forward communicates (SyncBatchNorm); the delayed "
                             "all-reduce overlaps the forward only where the forward sends nothing")
        if any(isinstance(a, DelayedUpdate) for a in dp.runner.attachments):
            raise ValueError("DelayedUpdate: dp has a DelayedUpdate already")
        self.dp, self.units = dp, list(range(weighted[layers - 1] + 1))
        self.params = [p for i in self.units for p in dp.sync.units[i].parameters()]
        if any(p.partial_over for p in self.params):
            raise ValueError("DelayedUpdate: the delayed layers' gradients are partial sums (a split model)")
        delayed = {id(p) for p in self.params}
        kept = [[p for p in b.params if id(p) not in delayed] for b in dp.sync.buckets]
        buckets = [Bucket(k, params) for k, params in enumerate(q for q in kept if q)]
        self.bucket = Bucket(len(buckets), [p for b in dp.sync.buckets for p in b.params
                                            if id(p) in delayed], delayed=True)
        dp.sync.watch([*buckets, self.bucket])
        dp.buckets = dp.sync.buckets
        dp.clock.streamed_forward = True
        dp.runner.attachments.append(self)      # last: its end_backward fires first, before the sync's
        self.pending: np.ndarray | None = None
        self._pending_steps, self._summed, self._last = 1, None, True

    # -- the runner's events ---------------------------------------------------------------------------------
    def begin(self, runner) -> None:
        """The step starts: all-reduce the last step's delayed gradients (they overlap the forward)."""
        if self.pending is None or self._summed is not None:
            return
        comm = self.dp.comm
        if comm.world_size > 1:
            allreduce(comm, self.pending, op="sum", algorithm=self.dp.sync.algorithm, out=self.pending)
        self._summed, self.pending = self.pending, None

    def begin_backward(self, last: bool) -> None:
        self._last = bool(last)

    def end_backward(self) -> None:
        """Keep this step's delayed gradients (unsummed) and give the update the last step's summed ones."""
        if not self._last:
            return
        steps = self.dp._micro_steps                    # step() divides every gradient by it
        fresh = np.concatenate([p.grad.ravel() for p in self.params])
        summed = self._summed if self._summed is not None else np.zeros_like(fresh)
        if steps != self._pending_steps:               # so that step() leaves Σ g / (last step's count)
            summed = summed * (steps / self._pending_steps)
        offset = 0
        for p in self.params:
            p.grad[...] = summed[offset:offset + p.size].reshape(p.shape)
            offset += p.size
        self.pending, self._pending_steps, self._summed = fresh, steps, None
