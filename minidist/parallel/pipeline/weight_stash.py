"""PipeDream on the cluster: weight stashing (a micro-batch's backward on a stage uses the weights its
forward used) and an update of the stage after every backward (no flush).

Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training" (SOSP 2019), §3.3
("Weight Stashing", "Vertical Sync"). The versions used, the staleness and the versions held, as
formulas: pipedream.py.

``WeightStash(stage, optimizer)`` is a step-runner attachment of one pipeline stage. Its versions are the
stage's weights after t updates, w_0, w_1, ...; w_t is the *latest*. A stage runs its forwards and
backwards in micro-batch order (1F1B over a stream), so a queue pairs them:

    forward of m    (the runner's begin ... end)  uses w_v with v = t (the latest; stashed), or with vertical
                    sync v = max(0, t − lag), lag = s: the version stage 0 used for m; then w_t is put back
    backward of m   (begin_backward ... end_backward)  the gradient g_m is computed at the stashed w_v,
                    then applied to the latest:  w_{t+1} = step(w_t, g_m)   (the optimizer's update)

A version is never written after it is made: an update steps a *copy* of w_t, so the arrays a stashed
micro-batch points at stay as its forward saw them (``p.data`` is rebound, never overwritten). The clock
charges the layers (F, B), not the updates.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from minidist.nn.checks import check_count
from minidist.nn.module import Module, Sequential
from minidist.nn.runner import Attachment

from .pipeline import Pipeline


class WeightStash(Attachment):
    """stage: the stage's Module; optimizer: an optimizer over exactly ``stage.parameters()`` (its state,
    e.g. momentum, follows the latest weights); lag: 0, or s (vertical sync). Records, in forward order,
    ``used[m]`` (the version its forward and backward used) and ``applied[m]`` (the version its update
    was applied to: staleness = applied[m] − used[m]); ``peak_versions``: the most versions held at once.
    """

    def __init__(self, stage: Module, optimizer, *, lag: int = 0):
        if not isinstance(stage, Module):
            raise TypeError(f"stage must be a minidist Module, got {type(stage).__name__}")
        self.params = stage.parameters()
        if [id(p) for p in getattr(optimizer, "params", ())] != [id(p) for p in self.params]:
            raise ValueError("optimizer must update exactly the stage's parameters, in their order "
                             "(build it on stage.parameters())")
        self.optimizer, self.lag = optimizer, check_count(lag, "lag", minimum=0)
        self.versions = {0: [p.data for p in self.params]}      # t -> the arrays of w_t
        self.latest = 0
        self.in_flight: deque[int] = deque()      # the version of each micro-batch between its F and B
        self.used: list[int] = []
        self.applied: list[int] = []
        self.peak_versions = 1

    @property
    def staleness(self) -> list[int]:
        """Per updated micro-batch: how many updates old the weights its gradient was computed at were."""
        return [t - v for v, t in zip(self.used, self.applied)]

    def _load(self, version: int) -> None:
        for p, w in zip(self.params, self.versions[version]):
            p.data = w

    def begin(self, runner) -> None:
        """A forward starts: run it at the latest version (vertical sync: ``lag`` versions older)."""
        v = max(0, self.latest - self.lag)
        self.in_flight.append(v)
        self.used.append(v)
        self._load(v)
        self.peak_versions = max(self.peak_versions, len(self.versions))

    def end(self) -> None:
        self._load(self.latest)

    def begin_backward(self, last: bool) -> None:
        """The oldest micro-batch in flight goes back: its stashed weights, a fresh gradient."""
        if not self.in_flight:
            raise ValueError("a backward pass without a forward in flight: WeightStash pairs them in order")
        self._load(self.in_flight[0])
        for p in self.params:
            p.zero_grad()

    def end_backward(self) -> None:
        """Apply the gradient to the latest weights (a copy of them: w_{t+1}); drop unneeded versions."""
        if not self.in_flight:
            raise ValueError("end_backward without a forward in flight: WeightStash pairs F and B in order")
        self.in_flight.popleft()
        self.applied.append(self.latest)
        for p, w in zip(self.params, self.versions[self.latest]):
            p.data = w.copy()
        self.optimizer.step()
        self.latest += 1
        self.versions[self.latest] = [p.data for p in self.params]
        needed = min([*self.in_flight, max(0, self.latest - self.lag)])
        for t in [t for t in self.versions if t < needed]:
            del self.versions[t]
        self.peak_versions = max(self.peak_versions, len(self.versions))


class StreamLoss:
    """The loss of a PipeDream stream: each micro-batch is its own mini-batch. Records every micro-batch's
    loss (``losses``); backward returns M · dL_m/dy, undoing the executor's weight n_m / N = 1 / M that
    makes a synchronous step's micro-batches sum to the batch mean (M a power of two: exactly)."""

    def __init__(self, loss_fn, num_micro_batches: int):
        self.loss_fn, self.M, self.losses = loss_fn, num_micro_batches, []

    def forward(self, prediction, target) -> float:
        self.losses.append(self.loss_fn.forward(prediction, target))
        return self.losses[-1]

    def backward(self):
        return self.loss_fn.backward() * self.M


class PipeDream(Pipeline):
    """PipeDream on the cluster: the "pipedream" table (1F1B over a stream of M micro-batches, no flush)
    with a WeightStash on every stage, which steps ``make_optimizer(stage parameters)`` after each backward.

    checkpoint as Pipeline's; vertical_sync: every stage uses the version stage 0 used for the micro-batch.
    ``train_step(x, target)`` trains on the stream: x and target hold M·b samples, micro-batch m the m-th b
    of them; returns their mean loss. ``losses``: each micro-batch's loss (last stage), ``stashes[k]``:
    stage k's WeightStash (versions, staleness).
    """

    def __init__(self, comm, model: Sequential, *, loss_fn, make_optimizer, num_micro_batches: int,
                 vertical_sync: bool = False, checkpoint=False):
        if not callable(make_optimizer):
            raise TypeError(f"make_optimizer must be a function params -> optimizer, got {make_optimizer!r}")
        if not isinstance(vertical_sync, bool):
            raise ValueError(f"vertical_sync must be True or False, got {vertical_sync!r}")
        self.stashes: dict[int, WeightStash] = {}

        def stash(k: int, stage: Sequential) -> list[WeightStash]:
            optimizer = make_optimizer(stage.parameters())
            self.stashes[k] = WeightStash(stage, optimizer, lag=k if vertical_sync else 0)
            return [self.stashes[k]]

        super().__init__(comm, model, loss_fn=StreamLoss(loss_fn, num_micro_batches),
                         num_micro_batches=num_micro_batches, schedule="pipedream", checkpoint=checkpoint,
                         stage_attachments=stash)

    @property
    def losses(self) -> list[float]:
        return self.loss_fn.losses

    def train_step(self, x: np.ndarray, target: np.ndarray, optimizer=None) -> float | None:
        if optimizer is not None:
            raise ValueError("PipeDream's stages step after every backward (make_optimizer=); "
                             "train_step takes no optimizer")
        if len(x) % self.M:
            raise ValueError(f"x has {len(x)} samples: a PipeDream stream needs M = {self.M} equal "
                             "micro-batches (a multiple of M samples)")
        return super().train_step(x, target)


def train_on_stream(comm, model: Sequential, loss_fn, make_optimizer, x: np.ndarray, target: np.ndarray,
                    num_micro_batches: int, *, flush_every: int | None = None):
    """Train on a stream of M equal micro-batches (x, target: their samples, in order) on the cluster, by
    PipeDream (flush_every=None) or by synchronous 1F1B with a flush (one optimizer step) every flush_every
    micro-batches. Returns (the executor, the micro-batches' losses on the last stage)."""
    if flush_every is None:
        pipe = PipeDream(comm, model, loss_fn=loss_fn, make_optimizer=make_optimizer,
                         num_micro_batches=num_micro_batches)
        pipe.train_step(x, target)
        return pipe, pipe.losses
    M, k = check_count(num_micro_batches, "num_micro_batches"), check_count(flush_every, "flush_every")
    if M % k or len(x) % M:
        raise ValueError(f"flush_every = {k} must divide num_micro_batches = {M}, and M the {len(x)} samples")
    pipe = Pipeline(comm, model, loss_fn=StreamLoss(loss_fn, 1), num_micro_batches=k, schedule="1f1b")
    optimizer, step = make_optimizer(pipe.parameters()), len(x) // M * k
    for i in range(0, len(x), step):
        pipe.train_step(x[i:i + step], target[i:i + step], optimizer)
    return pipe, pipe.loss_fn.losses
