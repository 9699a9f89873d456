"""The one-step-delayed update of the first layers (minidist.parallel.data.DelayedUpdate).

* per parameter after every step, on 1-4 ranks: equal (float64, 1e-10) to one process that steps the
  first layers with the LAST step's full-batch gradient (zeros at step 0) and the rest with this step's,
  also with a different number of no_sync micro-steps in each step;
* the simulated clock: the step takes max(3F, the communication stream), the delayed bucket all-reduced
  from the step's start (overlap.step_time with delayed_seconds); on a fast link that is 3F, against
  3F + C_1 without the delay (C_1: the first layer's ring all-reduce, the one exposed part); the bytes
  per step are the same with and without the delay;
* bad arguments: a TypeError / ValueError naming what is wrong, before anything is attached.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.cluster import Device, LinkModel, run
from minidist.nn import BatchNorm1d, CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.nn.runner import units
from minidist.optim import SGD
from minidist.parallel.data import DataParallel, DelayedUpdate
from minidist.parallel.data.overlap import step_time
from minidist.parallel.sync_batchnorm import convert_sync_batchnorm
from minidist.precision import FP16
from minidist.precision.mixed import MixedPrecisionTrainer
from minidist.sim.collective_cost import collective_seconds
from tests.parallel.data_parallel_helpers import make_data, make_model, make_optimizer

RTOL, ATOL = 1e-10, 1e-13


def _optimizer(name, params):
    return SGD(params, lr=0.1) if name == "plain_sgd" else make_optimizer(name, params)


def _groups(case):
    """The micro-batches of each step: steps[t] is a list of (x, y), all of case['micro'] rows."""
    batches = make_data(case["model"], case["seed"], [case["micro"]] * sum(case["counts"]))
    starts = np.cumsum([0, *case["counts"]])
    return [batches[a:b] for a, b in zip(starts[:-1], starts[1:], strict=True)]


def _delayed_reference(case):
    """One process: the first layers step on the last step's gradient (zeros at step 0)."""
    model = make_model(case["model"], case["seed"])
    opt, loss_fn = _optimizer(case["optimizer"], model.parameters()), CrossEntropyLoss()
    weighted = [u for u in units(model) if u.parameters()]
    delayed = [p for u in weighted[:case["layers"]] for p in u.parameters()]
    last = [np.zeros_like(p.data) for p in delayed]
    history = []
    for group in _groups(case):
        opt.zero_grad()
        loss_fn.forward(model.forward(np.concatenate([x for x, _ in group])),
                        np.concatenate([y for _, y in group]))
        model.backward(loss_fn.backward())
        fresh = [p.grad.copy() for p in delayed]
        for p, g in zip(delayed, last, strict=True):
            p.grad[...] = g
        last = fresh
        opt.step()
        history.append([p.data.copy() for p in model.parameters()])
    return history


def _delayed_training(comm, case):
    model = make_model(case["model"], case["seed"])
    dp = DataParallel(comm, model, _optimizer(case["optimizer"], model.parameters()), CrossEntropyLoss(),
                      bucket_bytes=case["bucket_bytes"], algorithm=case["algorithm"])
    DelayedUpdate(dp, layers=case["layers"])
    history = []
    for group in _groups(case):
        dp.zero_grad()
        with dp.no_sync():
            for x, y in group[:-1]:
                dp.forward_backward(x, y)
        dp.forward_backward(*group[-1])
        dp.step()
        history.append([p.data.copy() for p in model.parameters()])
    return history


@st.composite
def cases(draw):
    model = draw(st.sampled_from(["mlp", "tanh_layernorm", "conv"]))
    weighted = {"mlp": 2, "tanh_layernorm": 4, "conv": 2}[model]
    world_size = draw(st.integers(1, 4))
    return {"model": model, "world_size": world_size, "seed": draw(st.integers(0, 10**6)),
            "layers": draw(st.integers(1, weighted - 1)),
            "optimizer": draw(st.sampled_from(["plain_sgd", "sgd", "adam", "rmsprop"])),
            "algorithm": draw(st.sampled_from(["ring", "tree", "recursive_doubling"])),
            "bucket_bytes": draw(st.sampled_from([None, 100, 10**6])),
            "micro": draw(st.integers(world_size, 2 * world_size + 1)),
            "counts": draw(st.lists(st.integers(1, 2), min_size=4, max_size=4))}


@settings(max_examples=6)
@given(cases())
def test_delayed_update_equals_one_process_stepping_the_first_layers_one_step_late(case):
    want = _delayed_reference(case)
    for rank, got in enumerate(run(_delayed_training, case["world_size"], case, timeout=60)):
        for step, (g, w) in enumerate(zip(got, want, strict=True)):
            for i, (a, b) in enumerate(zip(g, w, strict=True)):
                np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL,
                                           err_msg=f"rank {rank}, step {step}, parameter {i}, {case}")


def test_delayed_update_leaves_the_first_layer_at_step_0_and_differs_from_plain_sgd():
    case = {"model": "mlp", "seed": 3, "layers": 1, "optimizer": "plain_sgd", "algorithm": "ring",
            "bucket_bytes": None, "micro": 4, "counts": [1, 1]}
    first = make_model("mlp", 3).parameters()[0].data
    got = run(_delayed_training, 2, case, timeout=60)[0]
    np.testing.assert_array_equal(got[0][0], first)          # step 0: no gradient of the last step yet
    assert not np.array_equal(got[1][0], first)               # step 1: the gradient of step 0


DEVICE = Device(flops=1e6)                   # 1 MFLOP/s
FAST_LINK = LinkModel(alpha=1e-5, beta=1e-8)
SLOW_LINK = LinkModel(alpha=1e-4, beta=1e-6)
FORWARD = [128e-6, 256e-6, 128e-6]           # P = 2, batch 4: 2*2*4*8, 2*2*8*8, 2*2*8*4 FLOPs
ELEMENTS = [40, 72, 36]                      # one bucket per layer at bucket_bytes = 200: [b, W] each


def _two_steps(comm, delay):
    rng = np.random.default_rng(1)
    model = Sequential(Linear(4, 8, rng=rng, dtype=np.float64), Linear(8, 8, rng=rng, dtype=np.float64),
                       Linear(8, 4, rng=rng, dtype=np.float64))
    dp = DataParallel(comm, model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), bucket_bytes=200)
    if delay:
        DelayedUpdate(dp, layers=1)
    x, y = rng.normal(size=(4, 4)), rng.integers(0, 4, size=4)
    times, sent = [], []
    for _ in range(3):
        start, before = comm.clock, comm.stats.bytes_sent
        dp.train_step(x, y)
        times.append(comm.clock - start)
        sent.append(comm.stats.bytes_sent - before)
    return times, sent, [b.size for b in dp.buckets]


@pytest.mark.parametrize("link", [FAST_LINK, SLOW_LINK], ids=["fast", "slow"])
def test_delayed_update_hides_the_first_layers_allreduce_on_the_clock(link):
    plain = run(_two_steps, 2, False, link=link, device=DEVICE, timeout=60)
    delayed = run(_two_steps, 2, True, link=link, device=DEVICE, timeout=60)
    (t_plain, sent_plain, buckets_plain), (t_delayed, sent_delayed, buckets_delayed) = plain[0], delayed[0]
    assert plain[0] == plain[1] and delayed[0] == delayed[1]
    assert buckets_plain == buckets_delayed == [36, 72, 40]   # the last bucket: layer 0's, the delayed one
    seconds = [collective_seconds("ring", 2, n, 8, link) for n in ELEMENTS]   # C_0, C_1, C_2 by layer
    rest = step_time(FORWARD, [2, 1], [seconds[2], seconds[1]], delayed_seconds=seconds[0])
    assert t_plain[1] == pytest.approx(step_time(FORWARD, [2, 1, 0], seconds[::-1]), rel=1e-12)
    assert t_delayed[0] == pytest.approx(step_time(FORWARD, [2, 1], seconds[:0:-1]), rel=1e-12)
    assert t_delayed[1:] == pytest.approx([rest, rest], rel=1e-12)
    assert sent_delayed[1:] == sent_plain[1:]                 # the same bytes, sent a step later
    three_f = 3 * sum(FORWARD)
    if link is FAST_LINK:                                     # everything else hides behind backward
        assert t_plain[1] == pytest.approx(three_f + seconds[0], rel=1e-12)
        assert t_delayed[1] == pytest.approx(three_f, rel=1e-12)
    else:                                                     # still faster, no longer 3F
        assert three_f < t_delayed[1] < t_plain[1]


def _refusals(comm):
    rng = np.random.default_rng(0)

    def model():
        return Sequential(Linear(4, 6, rng=rng), ReLU(), Linear(6, 3, rng=rng))

    def data_parallel(m=None, **options):
        m = m if m is not None else model()
        return DataParallel(comm, m, SGD(m.parameters(), lr=0.1), CrossEntropyLoss(), **options)

    messages = []
    for make, layers in ((lambda: model(), 1), (data_parallel, 0), (data_parallel, 2), (data_parallel, True),
                         (data_parallel, 1.0), (lambda: data_parallel(gradient_as_bucket_view=True), 1)):
        try:
            DelayedUpdate(make(), layers=layers)
        except (TypeError, ValueError) as error:
            messages.append((type(error).__name__, str(error)))
    m = model()
    opt = SGD(m.parameters(), lr=0.1)
    mixed = DataParallel(comm, m, opt, CrossEntropyLoss(),
                         mixed=MixedPrecisionTrainer(m, opt, CrossEntropyLoss(), FP16))
    bn = data_parallel(convert_sync_batchnorm(Sequential(Linear(4, 6, rng=rng), BatchNorm1d(6),
                                                         Linear(6, 3, rng=rng)), comm))
    twice = data_parallel()
    DelayedUpdate(twice)
    attached = len(twice.runner.attachments)
    for dp in (mixed, bn, twice):
        try:
            DelayedUpdate(dp)
        except ValueError as error:
            messages.append(("ValueError", str(error)))
    return messages, attached == len(twice.runner.attachments)


def test_delayed_update_refuses_bad_arguments():
    messages, unchanged = run(_refusals, 2, timeout=60)[0]
    assert unchanged
    want = [("TypeError", "dp must be a DataParallel, got Sequential"),
            ("ValueError", "layers must be an int in [1, 1]"), ("ValueError", "got 2"),
            ("ValueError", "got True"), ("ValueError", "got 1.0"),
            ("ValueError", "gradient_as_bucket_view"), ("ValueError", "plain precision (mixed=None)"),
            ("ValueError", "SyncBatchNorm"), ("ValueError", "has a DelayedUpdate already")]
    assert len(messages) == len(want), messages
    for (kind, text), (want_kind, want_text) in zip(messages, want, strict=True):
        assert kind == want_kind and want_text in text, (kind, text)
