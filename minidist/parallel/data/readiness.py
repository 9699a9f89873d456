"""GradientReadiness: which gradients are complete during backward — the base of the gradient syncs.

The step runner's ``after_backward(i, unit, dx)`` says "unit.parameters() have their gradients". A
parameter p held by u_p units (u_p = 2 for a tied weight) is *ready* in the step's last backward pass
(``begin_backward(last=True)``; the passes before it only accumulate, as DDP's ``no_sync``) once the last
of those units has run:

    begin_backward(last)    left_p = u_p for every p
    after_backward(unit)    left_p −= 1 for p in unit;  ready when left_p = 0
    p ready                 p.grad = Σ_c p.grad for c in p.partial_over   (tensor / sequence / context /
                            expert / spatial splits: collectives.partial.sum_partial_gradients)
    bucket ready            all its parameters ready -> bucket_complete(bucket), in bucket order
    end_backward            the parameters not ready yet are summed (an empty pass: a table's W tasks
                            made them), then backward_complete(the buckets that did not complete)

Keyed by parameter, so one attachment serves a whole model's runner and a pipeline stage's (whose units
are another model's). Two attachments build on it, one job each: GradientSync (sync.py: DDP's buckets,
allreduced as they complete) and ZeroSync (zero_sync.py: ZeRO 1-3, reduce-scatter and sharded step).
"""

from __future__ import annotations

from minidist.collectives.partial import sum_partial_gradients
from minidist.nn.module import Module, Parameter
from minidist.nn.runner import Attachment, units

from .buckets import Bucket


def check_communicator(name: str, comm, *, optional: bool = True) -> None:
    """TypeError unless comm is a Communicator (has rank and world_size), or None where optional."""
    if comm is None and optional:
        return
    if not (hasattr(comm, "rank") and hasattr(comm, "world_size")):
        raise TypeError(f"{name} must be a Communicator{' or None' if optional else ''}, got "
                        f"{type(comm).__name__}")


class GradientReadiness(Attachment):
    """The readiness of ``model``'s parameters' gradients (see the module docstring); a subclass says what
    its buckets are (``watch``) and what to do with a ready one (``bucket_complete``, ``backward_complete``).

    Args:
        model: the Module whose parameters this rank trains (a whole model or a pipeline stage's module).
    """

    def __init__(self, model: Module):
        if not isinstance(model, Module):
            raise TypeError(f"model must be a minidist Module, got {type(model).__name__}")
        self.model, self.params, self.units = model, model.parameters(), units(model)
        self._uses = {id(p): 0 for p in self.params}            # units a parameter belongs to (tied: 2)
        for unit in self.units:
            for p in unit.parameters():
                self._uses[id(p)] = self._uses.get(id(p), 0) + 1
        self._unit_params: dict[int, list[Parameter]] = {}
        self.buckets: list[Bucket] = []
        self._last = True

    def watch(self, buckets: list[Bucket]) -> None:
        """The buckets whose completion is reported: each parameter in exactly one, ``index`` = position."""
        self.buckets = buckets
        self.bucket_of = {id(p): b for b in buckets for p in b.params}
        self.begin_backward(True)

    def params_of(self, unit: Module) -> list[Parameter]:
        """unit.parameters(), looked up once per unit."""
        found = self._unit_params.get(id(unit))
        if found is None:
            found = self._unit_params[id(unit)] = unit.parameters()
        return found

    # -- the runner's events ---------------------------------------------------------------------------------
    def begin_backward(self, last: bool) -> None:
        self._last = bool(last)
        if self._last:
            self._left = dict(self._uses)
            self._waiting = {b.index: len(b.params) for b in self.buckets}

    def after_backward(self, i, unit, dx):
        """unit's parameters' gradients are ready: sum the partial ones, report the buckets they complete."""
        if not self._last:
            return dx
        ready = []
        for p in self.params_of(unit):
            self._left[id(p)] -= 1
            if self._left[id(p)] == 0:
                ready.append(p)
        self._sum_partial(ready)
        complete = []
        for p in ready:
            bucket = self.bucket_of[id(p)]
            self._waiting[bucket.index] -= 1
            if self._waiting[bucket.index] == 0:
                complete.append(bucket)
        for bucket in sorted(complete, key=lambda b: b.index):     # in bucket order, as DDP issues them
            self.bucket_complete(bucket)
        return dx

    def end_backward(self) -> None:
        """The step's last pass is done: sum what is not summed yet, report the buckets left."""
        if not self._last:
            return
        self._sum_partial([p for p in self.params if self._left[id(p)] > 0])
        self._left = dict.fromkeys(self._left, 0)
        self.backward_complete([b for b in self.buckets if self._waiting[b.index] > 0])

    @staticmethod
    def _sum_partial(params: list[Parameter]) -> None:
        """The partial ones of params summed over their groups, by the one function that does it
        (ZeRO-3: their data is freed by now; only p.grad is read)."""
        partial = [p for p in params if p.partial_over]
        if partial:
            sum_partial_gradients(partial)

    # -- what a subclass does with them ----------------------------------------------------------------------
    def bucket_complete(self, bucket: Bucket) -> None:
        """Every gradient of ``bucket`` is ready and summed over its partial groups (nothing here)."""

    def backward_complete(self, incomplete: list[Bucket]) -> None:
        """Every gradient is ready; ``incomplete``: the buckets bucket_complete did not see (nothing here)."""

