"""PipeDream on the cluster (minidist/parallel/pipeline/weight_stash.py, pipedream.py).

    training     the cluster run (P processes, a WeightStash per stage, an update after every backward)
                 equals pipedream.replay in one process — micro-batch m uses w_s after
                 max(0, m − (P − 1 − s)) updates on stage s (vertical sync: max(0, m − (P − 1))) —
                 per parameter, bitwise (M a power of two), after M momentum-SGD updates, P = 1..4
    staleness    stage s's update for m was computed min(m, P − 1 − s) updates ago (vertical sync: P − 1)
    versions     stage s holds at most P − s weight versions (vertical sync: P)
    bubble       free links, equal stages: one stream of K·M micro-batches idles (P − 1)/(KM + P − 1) of
                 the run, K synchronous 1F1B steps of M idle (P − 1)/(M + P − 1); each stage's idle
                 seconds do not grow with the stream (no idle slot in the steady state)
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.cluster import LinkModel, run
from minidist.nn import Linear, MSELoss, Sequential, Tanh
from minidist.optim import SGD
from minidist.parallel.pipeline import Pipeline, bubble_fraction, one_f_one_b_schedule, stage_ops
from minidist.parallel.pipeline.boundaries import split_by_layers
from minidist.parallel.pipeline.pipedream import (
    replay,
    synchronous,
    train_in_one_process,
    version_used,
)
from minidist.parallel.pipeline.registry import PLANNED, make_schedule
from minidist.parallel.pipeline.weight_stash import PipeDream, WeightStash, train_on_stream

D, B = 3, 4          # width, samples per micro-batch
FREE_LINKS = LinkModel(alpha=0.0, beta=0.0)


def model(P: int, head: bool = True, seed: int = 0) -> Sequential:
    """P blocks [Linear(D, D), Tanh] (equal stages) and a Linear(D, 2) head (on the last stage)."""
    rng = np.random.default_rng(seed)
    layers = [layer for _ in range(P) for layer in (Linear(D, D, rng=rng, dtype=np.float64), Tanh())]
    return Sequential(*layers, *[Linear(D, 2, rng=rng, dtype=np.float64)] * head)


def stream(M: int, outputs: int = 2, seed: int = 1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(M * B, D)), rng.normal(size=(M * B, outputs))


def momentum_sgd(params):
    return SGD(params, lr=0.2, momentum=0.9)


def train(comm, M, vertical_sync, checkpoint):
    x, target = stream(M)
    pipe = PipeDream(comm, model(comm.world_size), loss_fn=MSELoss(), make_optimizer=momentum_sgd,
                     num_micro_batches=M, vertical_sync=vertical_sync, checkpoint=checkpoint)
    pipe.train_step(x, target)
    stash = pipe.stashes[pipe.stage]
    return [p.data for p in pipe.parameters()], pipe.losses, stash.used, stash.staleness, stash.peak_versions


CASES = [(1, 4, False, False), (2, 8, False, False), (2, 8, True, False), (3, 8, False, False),
         (3, 8, True, False), (4, 8, False, False), (4, 8, True, False), (3, 6, False, True)]


@pytest.mark.parametrize("P, M, vertical_sync, checkpoint", CASES)
def test_pipedream_on_the_cluster_is_the_replay_with_stashed_weights_and_per_stage_delays(
        P, M, vertical_sync, checkpoint):
    results = run(train, P, M, vertical_sync, checkpoint, timeout=120)
    x, target = stream(M)
    xs, targets = np.split(x, M), np.split(target, M)

    def replayed(vertical):
        one = model(P)
        losses = replay(one, MSELoss(), xs, targets, momentum_sgd, split_by_layers(len(one), P), vertical)
        return [p.data for p in one.parameters()], losses

    params, losses = replayed(vertical_sync)
    cluster = [w for rank in results for w in rank[0]]
    assert len(cluster) == len(params)
    exact = M & (M - 1) == 0         # M a power of two: dL/dy · (1/M) · M is dL/dy exactly
    for got, want in zip(cluster, params, strict=True):
        if exact:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(results[-1][1], losses, rtol=0, atol=0 if exact else 1e-12)
    if P > 1:     # the delays matter: the other variant's replay trains differently
        other = replayed(not vertical_sync)[0]
        assert any(np.abs(a - b).max() > 1e-6 for a, b in zip(cluster, other, strict=True))
    for s, (_, _, used, stale, peak) in enumerate(results):
        assert used == [version_used(P, s, m, vertical_sync) for m in range(M)]
        lag = P - 1 if vertical_sync else P - 1 - s          # the staleness once the pipeline is full
        assert stale == [min(m, lag) for m in range(M)]
        assert peak == (P if vertical_sync else P - s)       # the versions held


def on_stream(comm, M, flush_every):
    x, target = stream(M)
    pipe, losses = train_on_stream(comm, model(comm.world_size), MSELoss(), momentum_sgd, x, target, M,
                                   flush_every=flush_every)
    return [p.data for p in pipe.parameters()], losses


@pytest.mark.parametrize("flush_every", [None, 1, 4])
def test_train_on_stream_is_train_in_one_process(flush_every):
    """PipeDream (flush_every=None) or synchronous 1F1B with a flush every k micro-batches, on the cluster
    and in one process: the same parameters and losses, bitwise."""
    P, M = 3, 8
    results = run(on_stream, P, M, flush_every, timeout=120)
    one = model(P)
    x, target = stream(M)
    losses = train_in_one_process(one, MSELoss(), np.split(x, M), np.split(target, M), momentum_sgd, P,
                                  flush_every)
    assert results[-1][1] == losses
    gathered = [w for rank in results for w in rank[0]]
    for got, want in zip(gathered, [p.data for p in one.parameters()], strict=True):
        np.testing.assert_array_equal(got, want)


def run_stream(comm, schedule, M, steps):
    """Free links, equal stages: (start, end, busy seconds) of `steps` train_steps of M micro-batches."""
    x, target = stream(M, outputs=D)
    one = model(comm.world_size, head=False)
    if schedule == "pipedream":
        pipe = PipeDream(comm, one, loss_fn=MSELoss(), make_optimizer=momentum_sgd, num_micro_batches=M)
    else:
        pipe = Pipeline(comm, one, loss_fn=MSELoss(), num_micro_batches=M, schedule=schedule)
    comm.barrier()
    start = comm.clock
    for _ in range(steps):
        pipe.train_step(x, target, None if schedule == "pipedream" else momentum_sgd(pipe.parameters()))
    return start, comm.clock, pipe.busy_seconds      # busy: over all the steps


def idle(results):
    """(bubble fraction of the run, each stage's idle seconds)."""
    starts, ends, busy = zip(*results, strict=True)
    makespan = max(ends) - min(starts)
    return 1 - sum(busy) / (len(results) * makespan), [makespan - b for b in busy]


def test_pipedream_has_no_idle_slot_in_its_steady_state_and_1f1b_flushes_every_step():
    P, M, K = 4, 4, 4
    kw = {"link": FREE_LINKS, "timeout": 120}
    flushed, flushed_idle = idle(run(run_stream, P, "1f1b", M, K, **kw))
    async_short, short_idle = idle(run(run_stream, P, "pipedream", K * M, 1, **kw))
    async_long, long_idle = idle(run(run_stream, P, "pipedream", 2 * K * M, 1, **kw))
    assert flushed == pytest.approx((P - 1) / (M + P - 1), rel=1e-9)
    assert async_short == pytest.approx((P - 1) / (K * M + P - 1), rel=1e-9)
    assert async_long == pytest.approx((P - 1) / (2 * K * M + P - 1), rel=1e-9)
    # Filling and draining the pipeline, once per stream: the idle seconds do not grow with the stream,
    # while K flushes idle K times as long.
    np.testing.assert_allclose(long_idle, short_idle, rtol=1e-9)
    np.testing.assert_allclose(flushed_idle, [K * t for t in short_idle], rtol=1e-9)


@given(P=st.integers(1, 8), M=st.integers(1, 24))
def test_pipedream_table_formulas(P, M):
    """The table is 1F1B's over the stream; the formulas are what its order implies: micro-batch m's
    forward on stage s follows max(0, m − (P − 1 − s)) of the stage's backwards (stage 0's count: vertical
    sync), and the versions needed after each task number at most P − s (vertical: P; M ≥ P: exactly)."""
    table = make_schedule("pipedream", P, M)
    assert table == one_f_one_b_schedule(P, M)
    assert bubble_fraction(table, P) == pytest.approx((P - 1) / (M + P - 1))
    idle_ticks = [len(table) - len(stage_ops(table, s)) for s in range(P)]
    assert idle_ticks == [2 * (P - 1)] * P
    backwards_before = []     # per stage: micro-batch -> backwards the stage ran before its forward
    for s in range(P):
        done, before = 0, {}
        for op in stage_ops(table, s):
            if op.kind == "F":
                before[op.micro_batch] = done
            done += op.kind == "B"
        backwards_before.append(before)
    for s in range(P):
        for vertical in (False, True):
            lag = s if vertical else 0
            used = [backwards_before[0 if vertical else s][m] for m in range(M)]
            assert used == [version_used(P, s, m, vertical) for m in range(M)]
            in_flight, latest, peak = [], 0, 1
            for op in stage_ops(table, s):
                if op.kind == "F":
                    in_flight.append(used[op.micro_batch])
                else:
                    in_flight.pop(0)
                    latest += 1
                kept = range(min([*in_flight, max(0, latest - lag)]), latest + 1)
                peak = max(peak, len(kept))
            expected = P if vertical else P - s             # the versions held
            assert peak == expected if M >= P else peak <= expected


def test_pipedream_is_a_schedule_of_the_registry_but_not_priced_as_one_step():
    assert "pipedream" not in PLANNED and "1f1b" in PLANNED


def refusals(comm):
    """Bad input, each refused with a ValueError (TypeError for a non-function make_optimizer)."""
    x, target = stream(4)
    pipe = PipeDream(comm, model(1), loss_fn=MSELoss(), make_optimizer=momentum_sgd, num_micro_batches=4)
    stage, messages = pipe.stages[pipe.stage], []
    for bad in (lambda: pipe.train_step(x[:-1], target[:-1]),
                lambda: pipe.train_step(x, target, momentum_sgd(pipe.parameters())),
                lambda: PipeDream(comm, model(1), loss_fn=MSELoss(), make_optimizer=momentum_sgd,
                                  num_micro_batches=4, vertical_sync="yes"),
                lambda: WeightStash(stage, momentum_sgd(model(1).parameters())),
                lambda: WeightStash(stage, momentum_sgd(pipe.parameters()), lag=-1),
                lambda: WeightStash(stage, momentum_sgd(pipe.parameters())).begin_backward(True),
                lambda: version_used(3, 3, 0),
                lambda: version_used(0, 0, 0)):
        with pytest.raises(ValueError) as error:
            bad()
        messages.append(str(error.value))
    with pytest.raises(ValueError, match="flush_every"):
        train_on_stream(comm, model(1), MSELoss(), momentum_sgd, x, target, 4, flush_every=3)
    with pytest.raises(ValueError, match="groups of"):
        synchronous(model(1), MSELoss(), np.split(x, 4), np.split(target, 4), momentum_sgd, 3)
    with pytest.raises(TypeError, match="make_optimizer"):
        PipeDream(comm, model(1), loss_fn=MSELoss(), make_optimizer=0.1, num_micro_batches=4)
    return messages


def test_pipedream_refuses_bad_input():
    messages = run(refusals, 1)[0]
    for words, message in zip(("multiple of M", "takes no optimizer", "vertical_sync", "exactly the stage",
                               "lag must be", "without a forward", "stage must be", "number of stages"),
                              messages, strict=True):
        assert words in message, message
