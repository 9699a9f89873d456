"""The new schedules run on the cluster (pipeline.py's Pipeline) train like one process, per parameter.

A float64 MLP of 8 layers (4 Linear + Tanh), MSE loss, SGD, three steps: interleaved 1F1B (v = 2 on 2 ranks,
v = 2 on 1 rank), ZB-H1 on 2 and 3 ranks (the backward split into B and W), Chimera on 2 and 4 ranks (two
replicas of each stage, their gradients summed), 1F1B itself through the same executor. Per parameter
after the steps, the loss per step, and the B/W split's products against the plain Linear backward.
"""

import numpy as np
import pytest

from minidist.cluster import LinkModel, run
from minidist.cluster.ledger import Device
from minidist.nn import Linear, MSELoss, Sequential, Tanh
from minidist.optim import SGD
from minidist.parallel.pipeline import Pipeline
from minidist.parallel.pipeline.boundaries import split_by_layers
from minidist.parallel.pipeline.chimera import chimera_schedule
from minidist.parallel.pipeline.interleaved import interleaved_schedule
from minidist.parallel.pipeline.schedule import one_f_one_b_schedule
from minidist.parallel.pipeline.tasks import replay
from minidist.parallel.pipeline.zero_bubble import DeferredWeightGrad, zero_bubble_schedule

STEPS, N, WIDTH = 3, 12, 5


def build(seed: int = 3) -> Sequential:
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(4):
        layers += [Linear(WIDTH, WIDTH, rng=rng, dtype=np.float64), Tanh()]
    return Sequential(*layers)


def data():
    rng = np.random.default_rng(7)
    return rng.normal(size=(N, WIDTH)), rng.normal(size=(N, WIDTH))


def reference():
    model, (x, t) = build(), data()
    loss_fn, opt, losses = MSELoss(), SGD(model.parameters(), lr=0.1), []
    for _ in range(STEPS):
        model.zero_grad()
        losses.append(loss_fn.forward(model.forward(x), t))
        model.backward(loss_fn.backward())
        opt.step()
    return [p.data for p in model.parameters()], losses


def _train(comm, schedule, num_stages, num_micro_batches):
    model, (x, t) = build(), data()
    pipe = Pipeline(comm, model, loss_fn=MSELoss(), schedule=schedule, num_stages=num_stages,
                        num_micro_batches=num_micro_batches)
    opt = SGD(pipe.parameters(), lr=0.1)
    losses = [pipe.train_step(x, t, opt) for _ in range(STEPS)]
    held = {id(p) for p in pipe.parameters()}
    return ({i: p.data for i, p in enumerate(model.parameters()) if id(p) in held}, losses,
            comm.stats.bytes_sent)


CASES = {
    "1f1b P=2": (2, lambda: one_f_one_b_schedule(2, 3), 2, 3),
    "interleaved P=2 v=2": (2, lambda: interleaved_schedule(2, 4, 2), 4, 4),
    "interleaved P=1 v=2": (1, lambda: interleaved_schedule(1, 2, 2), 2, 2),
    "zb-h1 P=2": (2, lambda: zero_bubble_schedule(2, 4), 2, 4),
    "zb-h1 P=3": (3, lambda: zero_bubble_schedule(3, 3), 3, 3),
    "chimera P=2": (2, lambda: chimera_schedule(2, 4), 2, 4),
    "chimera P=4": (4, lambda: chimera_schedule(4, 4), 4, 4),
}


@pytest.mark.parametrize("name", list(CASES))
def test_parallel_pipeline_modern_schedules_train_like_one_process(name):
    P, make_schedule, S, M = CASES[name]
    schedule = make_schedule()
    expected, expected_losses = reference()
    results = run(_train, P, schedule, S, M)
    seen = set()
    for params, _, _ in results:
        for i, value in params.items():
            np.testing.assert_allclose(value, expected[i], rtol=1e-10, atol=1e-12)
            seen.add(i)
    assert seen == set(range(len(expected)))          # every parameter lives somewhere
    for step in range(STEPS):                          # the ranks' partial losses add up to the batch's
        total = sum(losses[step] for _, losses, _ in results if losses[step] is not None)
        assert total == pytest.approx(expected_losses[step], rel=1e-12)
    # bytes: each micro-batch's activation and gradient at every boundary between ranks; Chimera also
    # exchanges, on every rank, the gradients of its two stages with the rank holding their replicas
    p2p = 2 * (S - 1) * N * WIDTH * 8 if P > 1 else 0
    replicas = P * 2 * (WIDTH * WIDTH + WIDTH) * 8 * (4 // S) if name.startswith("chimera") else 0
    assert sum(sent for *_, sent in results) == STEPS * (p2p + replicas)

def test_parallel_pipeline_split_backward_adds_up_to_the_plain_one():
    rng = np.random.default_rng(0)
    plain = Linear(4, 3, rng=rng, dtype=np.float64)
    split = DeferredWeightGrad(Linear(4, 3, rng=np.random.default_rng(0), dtype=np.float64))
    x, dy = rng.normal(size=(6, 4)), rng.normal(size=(6, 3))
    plain.forward(x)
    split.forward(x)
    dx = split.backward(dy)
    assert not split.linear.weight.grad.any()          # B leaves the weights alone
    split.weight_grad(split.pending)
    np.testing.assert_array_equal(dx, plain.backward(dy))
    np.testing.assert_array_equal(split.linear.weight.grad, plain.weight.grad)
    np.testing.assert_array_equal(split.linear.bias.grad, plain.bias.grad)
    with pytest.raises(TypeError, match="only a Linear"):
        DeferredWeightGrad(Tanh())


def _step_time(comm, schedule, num_stages, num_micro_batches):
    model, (x, t) = build(), data()
    pipe = Pipeline(comm, model, loss_fn=MSELoss(), schedule=schedule, num_stages=num_stages,
                        num_micro_batches=num_micro_batches)
    start = comm.clock
    pipe.train_step(x, t)
    return comm.clock - start


@pytest.mark.parametrize("name", ["interleaved P=2 v=2", "zb-h1 P=3", "chimera P=4"])
def test_parallel_pipeline_modern_clock_equals_the_tables_replay(name):
    """With free links, the step's simulated time = the table replayed with each task's FLOPs / device speed
    (F: the stage's forward FLOPs, B: 2× — 1× for a split Linear's B —, W: 1× the Linears')."""
    P, make_schedule, S, M = CASES[name]
    schedule = make_schedule()
    linear = 2 * (N // M) * WIDTH * WIDTH              # a Linear's forward FLOPs on a micro-batch
    tanh = (N // M) * WIDTH                            # a Tanh's: one per element
    split = any(t.kind == "W" for tick in schedule for t in tick)
    bounds, cost = split_by_layers(8, S), {}
    for k in range(S):
        kinds = ["linear" if i % 2 == 0 else "tanh" for i in range(bounds[k], bounds[k + 1])]
        lin, th = kinds.count("linear") * linear, kinds.count("tanh") * tanh
        cost["F", k], cost["W", k] = lin + th, lin
        cost["B", k] = lin + 2 * th if split else 2 * (lin + th)
    speed = Device().flops
    times = replay(schedule, lambda task: cost[task.kind, task.stage] / speed)
    predicted = max(end for _, end in times.values())
    measured = run(_step_time, P, schedule, S, M, link=LinkModel(0.0, 0.0))
    assert max(measured) == pytest.approx(predicted, rel=1e-12)
