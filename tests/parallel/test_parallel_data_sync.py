"""GradientSync (parallel/data/sync.py) and ZeroSync (zero_sync.py) on their own and on pipeline stages: after
3 AdamW steps every parameter equals the same training in one process (float64, per parameter).

    partial sums   ranks see disjoint rows, parameters marked partial_over their group (and a data group)
    data group     buckets of a few hundred bytes, overlapped on the compute clock; ZeRO 1, 2, 3
    pipeline       2 data × 2 pipeline (1F1B, GPipe, ZB-H1): a GradientSync (buckets + overlap) or
                   ZeroSync (ZeRO-1) per stage syncs once per step, after the stage's last backward;
                   with mixed precision (a MixedPrecisionTrainer per stage) bitwise DataParallel's
                   mixed-precision training
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.collectives import allgather
from minidist.collectives.pieces import split_range
from minidist.nn import Linear, MSELoss, ReLU, Sequential, Tanh
from minidist.nn.runner import Attachment, StepRunner
from minidist.optim import AdamW
from minidist.parallel.data import DataParallel, GradientSync, ShardWeightedLoss, ZeroSync
from minidist.parallel.pipeline import Pipeline
from minidist.precision import FP16, DynamicLossScaler, MixedPrecisionTrainer
from minidist.sim.compute import ComputeCharges

B, STEPS = 12, 3


def model(seed: int = 3) -> Sequential:
    rng = np.random.default_rng(seed)
    f64 = {"rng": rng, "dtype": np.float64}
    return Sequential(Linear(5, 8, **f64), Tanh(), Linear(8, 8, **f64), ReLU(), Linear(8, 6, **f64), Tanh(),
                      Linear(6, 3, **f64))


def batches():
    rng = np.random.default_rng(11)
    return [(rng.normal(size=(B, 5)), rng.normal(size=(B, 3))) for _ in range(STEPS)]


def one_process() -> list[np.ndarray]:
    net = model()
    optimizer = AdamW(net.parameters(), lr=0.02, weight_decay=0.1)
    runner = StepRunner(net, MSELoss())
    for x, y in batches():
        net.zero_grad()
        runner.forward_backward(x, y)
        optimizer.step()
    return [p.data for p in net.parameters()]


def close(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=f"parameter {i}")


def shard_of(comm, rows: int) -> tuple[int, int]:
    return split_range(rows, comm.world_size, comm.rank)


def train_plain(comm, zero: int, groups: str):
    """Each rank trains on its rows of every batch; how its gradient becomes the full one: ``groups``."""
    net = model()
    if groups == "partial":                 # one group, every parameter a partial sum over it
        data, shard_group = None, comm
        for p in net.parameters():
            p.partial_over.append(comm)
    elif groups == "partial+data":          # 2 data replicas × 2 ranks of partial sums
        data = comm.split(color=comm.rank % 2, key=comm.rank)
        shard_group = comm.split(color=comm.rank // 2, key=comm.rank)
        for p in net.parameters():
            p.partial_over.append(shard_group)
    else:
        data, shard_group = comm, comm
    clock = ComputeCharges(comm)
    make = (lambda ps: AdamW(ps, lr=0.02, weight_decay=0.1)) if zero else None
    sync = ZeroSync(net, data, stage=zero, bucket_bytes=200, make_optimizer=make) if zero else \
        GradientSync(net, data, bucket_bytes=200, overlap=True, clock=clock)
    optimizer = sync.optimizer if zero else AdamW(net.parameters(), lr=0.02, weight_decay=0.1)
    runner = StepRunner(net, None, [sync, clock])
    for x, y in batches():
        lo, hi = split_range(B, comm.world_size, comm.rank)
        net.zero_grad()
        runner.loss_fn = ShardWeightedLoss(MSELoss(), (hi - lo) / B)
        runner.forward_backward(x[lo:hi], y[lo:hi])
        sync.step() if zero else optimizer.step()
    assert len(sync.buckets) >= 4                       # 200-byte buckets (FSDP: one per Linear)
    if zero == 3:                           # the parameters live in shards: gather them, flat
        return [np.concatenate([np.concatenate(allgather(data, g.low)) for g in sync.groups])]
    return [p.data for p in net.parameters()]


@pytest.mark.parametrize("groups", ["partial", "partial+data", "data"])
def test_parallel_gradient_sync_sums_partial_and_data_gradients_like_one_process(groups):
    for got in run(train_plain, 4, 0, groups, timeout=120):
        close(got, one_process())


@pytest.mark.parametrize("zero", [1, 2])
def test_parallel_gradient_sync_zero_stages_equal_one_process(zero):
    for got in run(train_plain, 3, zero, "data", timeout=120):
        close(got, one_process())


def test_parallel_gradient_sync_zero3_equals_one_process():
    want = np.concatenate([p.ravel() for p in one_process()])
    for (got,) in run(train_plain, 3, 3, "data", timeout=120):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


class CountSyncs(Attachment):
    """How many backward passes a stage ran, and how many of them were the step's last."""

    def __init__(self):
        self.passes, self.last = 0, 0

    def begin_backward(self, last):
        self.passes += 1
        self.last += int(last)


def train_pipelined(comm, schedule: str, zero: int, M: int, partial: bool = False):
    """2 data replicas × a 2-stage pipeline; rank = d·2 + p. partial: the replicas' gradients are summed as
    partial sums over the data group (Parameter.partial_over), not by the data reduction."""
    d, p = divmod(comm.rank, 2)
    data = comm.split(color=p, key=d)
    pipe = comm.split(color=d, key=p)
    syncs, counts = [], []

    def attach(k, stage):
        make = (lambda ps: AdamW(ps, lr=0.02, weight_decay=0.1)) if zero else None
        for q in stage.parameters() if partial else []:
            q.partial_over.append(data)
        syncs.append(ZeroSync(stage, data, stage=zero, bucket_bytes=200, make_optimizer=make) if zero else
                     GradientSync(stage, None if partial else data, bucket_bytes=200))
        counts.append(CountSyncs())
        return [syncs[-1], counts[-1]]

    pipeline = Pipeline(pipe, model(), loss_fn=None, num_micro_batches=M, schedule=schedule,
                        stage_attachments=attach)
    optimizer = syncs[0] if zero else AdamW(pipeline.parameters(), lr=0.02, weight_decay=0.1)
    for x, y in batches():
        lo, hi = split_range(B, 2, d)
        pipeline.loss_fn = ShardWeightedLoss(MSELoss(), (hi - lo) / B)
        pipeline.train_step(x[lo:hi], y[lo:hi], optimizer)
    assert len(syncs[0].buckets) >= 2                   # 200-byte buckets
    W = schedule == "zb-h1"
    assert [(c.passes, c.last) for c in counts] == [(STEPS * (M + W), STEPS)]   # once per step
    return p, [q.data for q in pipeline.parameters()]


@pytest.mark.parametrize("schedule, zero, partial", [
    ("1f1b", 0, False), ("gpipe", 0, False), ("1f1b", 1, False), ("gpipe", 1, False), ("zb-h1", 0, False),
    ("1f1b", 0, True), ("zb-h1", 0, True)])
def test_parallel_gradient_sync_on_the_data_axis_of_a_pipeline_equals_one_process(schedule, zero, partial):
    want = one_process()
    cut = len(Sequential(*model().layers[:len(model().layers) // 2]).parameters())   # stage 0's parameters
    for p, got in run(train_pipelined, 4, schedule, zero, 3, partial, timeout=120):
        close(got, want[:cut] if p == 0 else want[cut:])


def mixed_trainer(net):
    optimizer = AdamW(net.parameters(), lr=0.02, weight_decay=0.1)
    return MixedPrecisionTrainer(net, optimizer, MSELoss(), FP16, scaler=DynamicLossScaler(init_scale=2.0**12,
                                                                                           growth_interval=2))


def mixed_data_parallel(comm):
    """The reference: DataParallel with mixed precision on 2 ranks (tests/parallel/test_parallel_data_mixed
    checks it against one process)."""
    net = float32_model()
    trainer = mixed_trainer(net)
    dp = DataParallel(comm, net, trainer.optimizer, MSELoss(), mixed=trainer, bucket_bytes=200)
    for x, y in batches():
        dp.train_step(x.astype(np.float32), y.astype(np.float32))
    return [p.data for p in net.parameters()], trainer.steps_skipped


def mixed_pipelined(comm):
    """The same on 2 data × 2 pipeline ranks: a MixedPrecisionTrainer and a GradientSync per stage."""
    d, p = divmod(comm.rank, 2)
    data, pipe = comm.split(color=p, key=d), comm.split(color=d, key=p)
    syncs = []

    def attach(k, stage):
        trainer = mixed_trainer(stage)
        syncs.append(GradientSync(stage, data, bucket_bytes=200, mixed=trainer, inf_group=comm))
        return [syncs[-1], trainer]

    pipeline = Pipeline(pipe, float32_model(), loss_fn=None, num_micro_batches=1, schedule="1f1b",
                        stage_attachments=attach)
    for x, y in batches():
        lo, hi = split_range(B, 2, d)
        pipeline.loss_fn = ShardWeightedLoss(MSELoss(), (hi - lo) / B)
        pipeline.train_step(x[lo:hi].astype(np.float32), y[lo:hi].astype(np.float32), syncs[0])
    return p, [q.data for q in pipeline.parameters()], syncs[0].mixed.steps_skipped


def float32_model() -> Sequential:
    net = model()
    for q in net.parameters():
        q.data, q.grad = q.data.astype(np.float32), q.grad.astype(np.float32)
    return net


def test_parallel_mixed_precision_with_gradient_sync_on_pipeline_stages_is_data_parallels_bitwise():
    want, skipped = run(mixed_data_parallel, 2, timeout=120)[0]
    cut = len(Sequential(*model().layers[:len(model().layers) // 2]).parameters())
    for p, got, stage_skipped in run(mixed_pipelined, 4, timeout=120):
        assert stage_skipped == skipped
        for a, b in zip(got, want[:cut] if p == 0 else want[cut:], strict=True):
            assert a.dtype == np.float32 and np.array_equal(a, b)
