"""PipeDream: asynchronous 1F1B over a stream of micro-batches, without a flush — its table, its staleness
and weight versions as formulas, and its training replayed in one process from those formulas.

Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training" (SOSP 2019); the
"Distributed Deep Learning (Part II)" slides ("PipeDream: Use Async Updates to remove Bubble";
"Removing bubbles leads to stale weights").

PipeDream runs 1F1B's table (schedule.py; registry name "pipedream") over the whole stream, without a
flush, and lets every backward update its stage (weight_stash.py): the fill and the drain, 2(P − 1) idle
ticks per stage, are paid once per run, so the steady state has no idle slot — and the weights are stale.
Stage s (of P) runs F(m) after max(0, m − (P − 1 − s)) of its backwards, so

    version used by m on stage s    v_s(m) = max(0, m − (P − 1 − s))   (weight stashing: F and B alike)
                                    v(m)   = max(0, m − (P − 1))       (vertical sync: stage 0's, everywhere)
    its update is applied to        w_s after m updates: staleness m − v = min(m, P − 1 − s) (vertical: P − 1)
    versions held on stage s        P − s                               (vertical sync: P)

    w_s(m + 1) = w_s(m) − η · ∇_s loss_m(w_0(v_0(m)), ..., w_{P−1}(v_{P−1}(m)))     (SGD; any optimizer)

``replay`` is this training in one process (weight_stash.PipeDream, on the cluster, equals it bitwise
for float64 models and M a power of two).
"""

from __future__ import annotations

from minidist.nn.checks import check_count, check_rank, check_same_length
from minidist.nn.module import Sequential

from .boundaries import check_boundaries, split_by_layers


def version_used(num_stages: int, stage: int, micro_batch: int, vertical_sync: bool = False) -> int:
    """v_s(m): how many updates stage s had applied to the weights micro-batch m's F and B use."""
    P = check_count(num_stages, "number of stages P")
    s = check_rank(stage, P, "stage")
    return max(0, check_count(micro_batch, "micro_batch", 0) - (P - 1 - (0 if vertical_sync else s)))


def replay(model: Sequential, loss_fn, xs, targets, make_optimizer, boundaries,
           vertical_sync: bool = False) -> list[float]:
    """PipeDream's training in one process, from the formulas above: for m = 0, 1, ...: every stage s
    loads w_s(v_s(m)), micro-batch m runs forward and backward through the whole model (dL_m/dy unscaled:
    each micro-batch is its own mini-batch), then every stage steps its own optimizer from w_s(m).

    model: the Sequential (trained in place: it ends at the latest weights); xs, targets: the M
    micro-batches; make_optimizer(params) -> an optimizer, called once per stage; boundaries: the
    stages' layer indices [0, b_1, ..., L]. Returns the M losses."""
    check_same_length(xs, targets, "xs and targets")
    boundaries = check_boundaries(boundaries, len(model), len(boundaries) - 1)
    P = len(boundaries) - 1
    stages = [Sequential(*model.layers[boundaries[s]:boundaries[s + 1]]).parameters() for s in range(P)]
    optimizers = [make_optimizer(params) for params in stages]
    versions = [[[p.data for p in params]] for params in stages]       # versions[s][t]: w_s after t updates
    losses = []
    for m, (x, target) in enumerate(zip(xs, targets)):
        for s, params in enumerate(stages):
            for p, w in zip(params, versions[s][version_used(P, s, m, vertical_sync)]):
                p.data = w
        model.zero_grad()
        losses.append(loss_fn.forward(model.forward(x), target))
        model.backward(loss_fn.backward())
        for s, params in enumerate(stages):
            for p, w in zip(params, versions[s][-1]):
                p.data = w.copy()
            optimizers[s].step()
            versions[s].append([p.data for p in params])
    return losses


def synchronous(model: Sequential, loss_fn, xs, targets, make_optimizer, num_micro_batches: int
                ) -> list[float]:
    """Synchronous 1F1B's (or GPipe's) training of the same stream in one process, for comparison: the
    micro-batches in groups of M, each group's gradient Σ_m (1/M)·∇loss_m at the group's weights (no
    staleness), one optimizer step per group (a flush). Returns the losses of the micro-batches."""
    M = check_count(num_micro_batches, "num_micro_batches")
    check_same_length(xs, targets, "xs and targets")
    if len(xs) % M:
        raise ValueError(f"{len(xs)} micro-batches do not make groups of num_micro_batches = {M}")
    optimizer, losses = make_optimizer(model.parameters()), []
    for m, (x, target) in enumerate(zip(xs, targets)):
        if m % M == 0:
            model.zero_grad()
        losses.append(loss_fn.forward(model.forward(x), target))
        model.backward(loss_fn.backward() * (1 / M))
        if m % M == M - 1:
            optimizer.step()
    return losses


def train_in_one_process(model: Sequential, loss_fn, xs, targets, make_optimizer, num_stages: int,
                         flush_every: int | None = None) -> list[float]:
    """weight_stash.train_on_stream's training in one process: PipeDream's ``replay`` over num_stages
    stages of equal layer counts (flush_every=None), or ``synchronous`` with a flush every flush_every."""
    if flush_every is not None:
        return synchronous(model, loss_fn, xs, targets, make_optimizer, flush_every)
    return replay(model, loss_fn, xs, targets, make_optimizer, split_by_layers(len(model), num_stages))
