"""The gradient syncs, one job each on one readiness base (parallel/data/buckets.py, sync.py, zero_sync.py).

    readiness      a parameter is ready when the last unit holding it (a tied weight: its second) has run
                   the step's last backward; buckets are reported in order as they complete, the rest at
                   end_backward (an empty pass reports them all); passes before the last report nothing
    one sum        every partial gradient is summed by collectives.partial.sum_partial_gradients, once per
                   step (ZeRO-3: with the parameter's data already freed)
    one math       on 2 data × 2 partial ranks the DDP attachment (GradientSync) and the ZeRO attachment
                   (ZeroSync, stages 1, 2, 3) give bitwise the same parameters after 3 AdamW steps (every
                   sum has two terms), equal to one process
    refusals       a ZeroSync refused for its arguments leaves the model as it was
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.collectives import allgather, partial
from minidist.collectives.pieces import split_range
from minidist.nn import Linear, MSELoss, ReLU, Sequential, Tanh
from minidist.nn.module import Module, Parameter
from minidist.nn.runner import Attachment, StepRunner, backward_through
from minidist.optim import SGD, AdamW
from minidist.parallel.data import GradientReadiness, GradientSync, ShardWeightedLoss, ZeroSync, buckets
from minidist.parallel.data.buckets import assign_buckets

B, STEPS = 12, 3


def model(seed: int = 3) -> Sequential:
    rng = np.random.default_rng(seed)
    f64 = {"rng": rng, "dtype": np.float64}
    return Sequential(Linear(5, 8, **f64), Tanh(), Linear(8, 8, **f64), ReLU(), Linear(8, 3, **f64))


def batches():
    rng = np.random.default_rng(11)
    return [(rng.normal(size=(B, 5)), rng.normal(size=(B, 3))) for _ in range(STEPS)]


def adamw(params):
    return AdamW(params, lr=0.02, weight_decay=0.1)


# -- readiness, in one process -------------------------------------------------------------------------------
class Reports(GradientReadiness):
    """One bucket per parameter; writes what the base reports into ``log``."""

    def __init__(self, net, log):
        super().__init__(net)
        self.watch(assign_buckets(self.params, None))
        self.log = log

    def bucket_complete(self, bucket):
        self.log.append(("ready", bucket.index))

    def backward_complete(self, incomplete):
        self.log.append(("end", [b.index for b in incomplete]))


class Units(Attachment):
    def __init__(self, log):
        self.log = log

    def after_backward(self, i, unit, dx):
        self.log.append(("unit", i))
        return dx


class Scale(Module):
    """y = x · w (elementwise, w of shape (n,)): a layer with a parameter and nothing else to it."""

    def __init__(self, w: Parameter):
        self.weight = w

    def forward(self, x):
        self.x = x
        return x * self.weight.data

    def backward(self, dy):
        self.weight.grad += (self.x * dy).sum(axis=0)
        return dy * self.weight.data


def test_parallel_readiness_reports_a_parameter_after_its_last_unit_and_buckets_in_order():
    tied, other = Parameter(np.full(4, 2.0)), Parameter(np.full(4, 3.0))
    net = Sequential(Scale(tied), Tanh(), Scale(other), Scale(tied))    # tied: ready after unit 0 only
    log = []
    runner = StepRunner(net, None, [Reports(net, log), Units(log)])     # after_*: Units' first
    x, dy = np.ones((3, 4)), np.ones((3, 4))
    # one bucket per parameter, in reverse parameter order: 0 = other, 1 = tied
    assert net.parameters() == [tied, other]
    runner.forward(x)
    runner.backward(dy, last=False)                   # an earlier micro-batch: nothing is ready
    assert log == [("unit", 3), ("unit", 2), ("unit", 1), ("unit", 0)]
    log.clear()
    runner.forward(x)
    runner.backward(dy)
    assert log == [("unit", 3), ("unit", 2), ("ready", 0), ("unit", 1), ("unit", 0), ("ready", 1),
                   ("end", [])]
    log.clear()
    backward_through([], None, runner.attachments)    # an empty pass (a table's W tasks made the gradients)
    assert log == [("end", [0, 1])]


# -- one sum, one math: 2 data replicas × 2 ranks of partial sums --------------------------------------------
def one_process() -> list[np.ndarray]:
    net = model()
    optimizer = adamw(net.parameters())
    runner = StepRunner(net, MSELoss())
    for x, y in batches():
        net.zero_grad()
        runner.forward_backward(x, y)
        optimizer.step()
    return [p.data for p in net.parameters()]


def train(comm, stage: int):
    """Rank r trains rows split_range(B, 4, r); each gradient is partial over the group of r and r ± 2 (it
    sums those ranks' rows), the data group (r and r ± 1) sums the two partial sums. Records how often the
    one partial-sum function summed each parameter, and whether its data was there."""
    net = model()
    data = comm.split(color=comm.rank // 2, key=comm.rank)
    group = comm.split(color=comm.rank % 2, key=comm.rank)
    for p in net.parameters():
        p.partial_over.append(group)
    summed, freed = {id(p): 0 for p in net.parameters()}, []

    def recording(params, algorithm="pairwise"):
        for p in params:
            if p.partial_over:
                summed[id(p)] += 1
                freed.append(p.data is None)
        partial.sum_partial_gradients(params, algorithm)

    assert buckets.sum_partial_gradients is partial.sum_partial_gradients      # the one function
    buckets.sum_partial_gradients = recording
    sync = ZeroSync(net, data, stage=stage, bucket_bytes=200, make_optimizer=adamw) if stage else \
        GradientSync(net, data, bucket_bytes=200)
    optimizer = sync if stage else adamw(net.parameters())
    runner = StepRunner(net, None, [sync])
    for x, y in batches():
        lo, hi = split_range(B, comm.world_size, comm.rank)
        net.zero_grad()
        runner.loss_fn = ShardWeightedLoss(MSELoss(), (hi - lo) / B)
        runner.forward_backward(x[lo:hi], y[lo:hi])
        optimizer.step()
    buckets.sum_partial_gradients = partial.sum_partial_gradients
    if stage == 3:                                   # the parameters live in shards: gather them
        full = {id(p): v for g in sync.groups for p, v in zip(g.params, g.views(
            np.concatenate(allgather(data, g.low))), strict=True)}
        return [full[id(p)] for p in net.parameters()], sorted(summed.values()), freed
    return [p.data for p in net.parameters()], sorted(summed.values()), freed


def test_parallel_ddp_and_zero_attachments_sum_partials_once_and_train_bitwise_alike():
    want = one_process()
    ddp = run(train, 4, 0, timeout=120)
    for stage in (0, 1, 2, 3):
        results = ddp if stage == 0 else run(train, 4, stage, timeout=120)
        for rank, (got, summed, freed) in enumerate(results):
            assert summed == [STEPS] * 6, f"stage {stage}, rank {rank}: partial sums per parameter {summed}"
            assert all(freed) if stage == 3 else not any(freed)      # ZeRO-3 sums without the data
            for i, (a, b, c) in enumerate(zip(got, ddp[rank][0], want, strict=True)):
                assert np.array_equal(a, b), f"stage {stage}, rank {rank}, parameter {i}: not DDP's bitwise"
                np.testing.assert_allclose(a, c, rtol=1e-10, atol=1e-12, err_msg=f"parameter {i}")


# -- refusals ------------------------------------------------------------------------------------------------
def refused(comm, kwargs):
    net = model()
    before = [(p.data, p.data.copy()) for p in net.parameters()]
    try:
        ZeroSync(net, comm if kwargs.pop("data", True) else None, **kwargs)
    except (TypeError, ValueError) as error:
        unchanged = all(p.data is array and np.array_equal(array, copy)
                        for p, (array, copy) in zip(net.parameters(), before, strict=True))
        return type(error).__name__, str(error), unchanged
    return None


@pytest.mark.parametrize("kwargs, kind, words", [
    (dict(stage=0, make_optimizer=adamw), "ValueError", "stage must be a ZeRO stage 1, 2 or 3"),
    (dict(stage=True, make_optimizer=adamw), "ValueError", "stage must be"),
    (dict(stage=1, make_optimizer=adamw, data=False), "TypeError", "data must be a Communicator"),
    (dict(stage=2, make_optimizer=SGD(model().parameters(), lr=0.1)), "TypeError", "must be a function"),
    (dict(stage=3, make_optimizer=lambda ps: SGD(model().parameters(), lr=0.1)), "ValueError",
     "on the parameters it is given"),
])
def test_parallel_zero_sync_refuses_bad_arguments_before_touching_the_model(kwargs, kind, words):
    for got in run(refused, 2, kwargs, timeout=60):
        assert got is not None, "accepted"
        assert got[0] == kind and words in got[1] and got[2], got


def test_parallel_gradient_sync_has_no_zero_stage():
    with pytest.raises(TypeError, match="zero"):        # sharding is ZeroSync's job
        GradientSync(model(), None, zero=1)
