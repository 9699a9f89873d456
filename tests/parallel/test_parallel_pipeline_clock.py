"""What a pipeline run measures on the simulated clock: the bubble, activation memory, checkpointing's
price, and the bytes on the wire.

Every stage is the same [Linear(d, d), Tanh] block and every micro-batch has the same size, so stage
costs are equal; links are free (α = β = 0) so that the clock holds compute and waiting only. Then:

    measured bubble = 1 − Σ_s busy_s / (P · makespan) = (P−1)/(M+P−1)   (GPipe, 1F1B)
                                                     = (P−1)/P          (naive, any M)
    peak activations: GPipe holds M micro-batches at every stage, 1F1B min(P − s, M) at stage s
    checkpointing: peak lower by (k − 1)·(A − |x|) where a stage holds at most k micro-batches (GPipe:
        k = M), compute × 4/3   (A: one micro-batch's activations of a stage, |x| its input;
        F + 2F for backward + F for the recompute)
    traffic: stage s sends N·d·8 bytes of activations forward and as many gradient bytes backward
"""

import numpy as np
import pytest

from minidist.cluster import LinkModel, run
from minidist.nn import Linear, MSELoss, Sequential, Tanh
from minidist.nn.checkpoint import forward_saving
from minidist.parallel.pipeline import Pipeline
from minidist.parallel.pipeline.registry import make_schedule
from minidist.parallel.pipeline.schedule import SCHEDULES, max_in_flight, stage_ops

D, SAMPLES_PER_MICRO_BATCH = 4, 3
FREE_LINKS = LinkModel(alpha=0.0, beta=0.0)


def equal_stages(num_stages: int) -> Sequential:
    rng = np.random.default_rng(0)
    layers = []
    for _ in range(num_stages):
        layers += [Linear(D, D, rng=rng, dtype=np.float64), Tanh()]
    return Sequential(*layers)


def measure(comm, schedule, micro_batch_counts, checkpoint=False):
    """For each M: (step start, step end, busy seconds, peak bytes, ops in order, bytes sent, received)."""
    P, out = comm.world_size, []
    for M in micro_batch_counts:
        N = M * SAMPLES_PER_MICRO_BATCH
        rng = np.random.default_rng(M)
        x, target = rng.normal(size=(N, D)), rng.normal(size=(N, D))
        pipe = Pipeline(comm, equal_stages(P), loss_fn=MSELoss(), num_micro_batches=M, schedule=schedule,
                        checkpoint=checkpoint)
        comm.barrier()  # every clock jumps to the latest: the step starts at one time on every stage
        start, sent, received = comm.clock, comm.stats.bytes_sent, comm.stats.bytes_received
        pipe.train_step(x, target)
        out.append((start, comm.clock, pipe.busy_seconds, pipe.peak_activation_bytes,
                    [op for op, _, _ in pipe.timeline], comm.stats.bytes_sent - sent,
                    comm.stats.bytes_received - received))
    return out


def schedule_params():
    return [pytest.param(n, marks=pytest.mark.exercise("gpipe_schedule")) if n == "gpipe" else n
            for n in SCHEDULES]


@pytest.mark.parametrize("schedule", schedule_params())
def test_parallel_pipeline_measured_bubble_traffic_and_order(schedule):
    micro_batch_counts = list(range(1, 9))
    for P in (1, 2, 3, 4):
        per_rank = run(measure, P, schedule, micro_batch_counts, link=FREE_LINKS, timeout=120)
        for i, M in enumerate(micro_batch_counts):
            starts, ends, busy, _, orders, sent, received = zip(*(rank[i] for rank in per_rank), strict=True)
            makespan = max(ends) - min(starts)
            bubble = 1 - sum(busy) / (P * makespan)
            expected = (P - 1) / P if schedule == "naive" else (P - 1) / (M + P - 1)
            assert bubble == pytest.approx(expected, rel=1e-9, abs=1e-12), (P, M)
            for s in range(P):
                assert orders[s] == stage_ops(make_schedule(schedule, P, M), s)
                boundary_bytes = M * SAMPLES_PER_MICRO_BATCH * D * 8
                assert sent[s] == boundary_bytes * ((s < P - 1) + (s > 0))
                assert received[s] == sent[s]


@pytest.mark.exercise("gpipe_schedule")
def test_parallel_pipeline_1f1b_holds_fewer_micro_batches_than_gpipe():
    P, counts = 4, [1, 2, 3, 6]
    gpipe = run(measure, P, "gpipe", counts, link=FREE_LINKS, timeout=120)
    one_f_one_b = run(measure, P, "1f1b", counts, link=FREE_LINKS, timeout=120)
    for i, M in enumerate(counts):
        for s in range(P):
            # equal micro-batches hold equal bytes: peaks are in the ratio of micro-batches held
            assert gpipe[s][i][3] * min(P - s, M) == one_f_one_b[s][i][3] * M, (M, s)


@pytest.mark.parametrize("schedule", schedule_params())
def test_parallel_pipeline_checkpointing_saves_the_expected_memory_and_costs_a_third_more_compute(schedule):
    P, counts = 3, [1, 4]
    plain = run(measure, P, schedule, counts, link=FREE_LINKS, timeout=120)
    ckpt = run(measure, P, schedule, counts, True, link=FREE_LINKS, timeout=120)
    # one micro-batch through one stage [Linear, Tanh], measured here in one process
    x = np.random.default_rng(0).normal(size=(SAMPLES_PER_MICRO_BATCH, D))
    _, saved = forward_saving(equal_stages(1), x)
    activations, inputs = saved.nbytes, x.nbytes
    assert activations == 2 * x.nbytes  # Linear keeps its input, Tanh its output
    for i, M in enumerate(counts):
        held = max_in_flight(make_schedule(schedule, P, M), P)  # micro-batches a stage holds at its peak
        for s in range(P):
            # k held micro-batches: plain k·A; checkpointed k·|x| + (A − |x|) during one recompute
            assert plain[s][i][3] - ckpt[s][i][3] == (held[s] - 1) * (activations - inputs), (M, s)
            assert ckpt[s][i][2] == pytest.approx(plain[s][i][2] * 4 / 3, rel=1e-12)


def _big_step(comm, schedule):
    rng = np.random.default_rng(0)
    model = Sequential(*[Linear(64, 64, rng=rng, dtype=np.float64) for _ in range(comm.world_size)])
    pipe = Pipeline(comm, model, loss_fn=MSELoss(), num_micro_batches=6, schedule=schedule)
    x = np.random.default_rng(1).normal(size=(6 * 128, 64))  # 64 KiB per message
    pipe.train_step(x, x)
    return [p.grad for p in pipe.parameters()]


def test_parallel_pipeline_1f1b_messages_larger_than_the_mailbox_do_not_deadlock():
    """1F1B's neighbours send to each other at once; the executor pairs those messages in a sendrecv."""
    one_f_one_b = run(_big_step, 4, "1f1b", mailbox_bytes=16 * 1024, timeout=60)
    naive = run(_big_step, 4, "naive", mailbox_bytes=16 * 1024, timeout=60)
    for a, b in zip(one_f_one_b, naive, strict=True):
        for g, h in zip(a, b, strict=True):
            np.testing.assert_allclose(g, h, rtol=1e-12, atol=1e-12)
