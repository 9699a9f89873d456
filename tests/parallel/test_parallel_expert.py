"""Expert parallelism: training equals single-process MoE training per parameter after several steps
(e ∈ {1, 2, 4}, 1 or 2 experts per rank, top-1 and top-2), the same tokens are dropped, the all-to-all
bytes equal the formula, the busiest expert sets the step on the simulated clock, and bad layouts are
refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.cluster import Device, LinkModel, run
from minidist.collectives import sum_gradients
from minidist.nn import Linear, MoE, MSELoss, Sequential
from minidist.optim import SGD
from minidist.parallel.expert import ExpertParallelMoE
from minidist.parallel.expert.cost import alltoall_bytes_sent, expert_step_seconds, imbalance

D_IN, D, D_FF, D_OUT, N = 3, 4, 6, 2, 6  # N tokens per rank
STEPS = 3


def _model(num_experts, k, capacity_factor, groups, seed=0):
    rng = np.random.default_rng(seed)
    return Sequential(Linear(D_IN, D, rng=rng, dtype=np.float64),
                      MoE(D, D_FF, num_experts, k, capacity_factor, aux_loss_coef=0.1, z_loss_coef=0.01,
                          groups=groups, rng=rng, dtype=np.float64),
                      Linear(D, D_OUT, rng=rng, dtype=np.float64))


def _data(e, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((e * N, D_IN)), rng.standard_normal((e * N, D_OUT))


def _train(model, moe_layer, x, t, comm=None):
    opt, loss_fn = SGD(model.parameters(), lr=0.2, momentum=0.9), MSELoss()
    kept, sent = [], []
    for _ in range(STEPS):
        before = comm.stats.bytes_sent if comm is not None else 0
        opt.zero_grad()
        loss_fn.forward(model(x), t)
        model.backward(loss_fn.backward())
        kept.append(moe_layer.routing.kept.copy())
        sent.append((comm.stats.bytes_sent - before, moe_layer.sent_tokens, moe_layer.received_tokens)
                    if comm is not None else None)
        if comm is not None:
            _average_gradients(comm, model, moe_layer)
        opt.step()
    return kept, sent


def _average_gradients(comm, model, ep):
    """The gradient of the mean of the e ranks' losses: a replicated parameter holds this rank's tokens' term
    (sum it over the ranks), an expert already the sum over every rank's tokens (the all-to-all brought
    them); then divide every gradient by e."""
    experts = {id(p) for p in ep.expert_parameters()}
    sum_gradients(comm, [p for p in model.parameters() if id(p) not in experts], algorithm="ring")
    for p in model.parameters():
        p.grad /= comm.world_size


def _worker(comm, num_experts, k, capacity_factor):
    e, r = comm.world_size, comm.rank
    model = _model(num_experts, k, capacity_factor, groups=1)
    model.layers[1] = ep = ExpertParallelMoE(comm, model.layers[1])
    x, t = _data(e)
    rows = slice(r * N, (r + 1) * N)
    kept, sent = _train(model, ep, x[rows], t[rows], comm)
    params = {"0": [p.data for p in model.layers[0].parameters()], "router": ep.router.weight.data,
              "2": [p.data for p in model.layers[2].parameters()],
              "experts": {ep.first_expert + j: [p.data for p in ex.parameters()]
                          for j, ex in enumerate(ep.experts)}}
    return params, kept, sent


@pytest.mark.parametrize("e,per_rank,k,capacity_factor", [
    (1, 2, 1, 1.0), (2, 1, 1, 1.0), (2, 2, 2, 0.75), (4, 1, 1, 0.75), (4, 2, 2, 1.0), (4, 1, 2, 2.0),
])
def test_expert_parallel_training_equals_one_process(e, per_rank, k, capacity_factor):
    num_experts = e * per_rank
    results = run(_worker, e, num_experts, k, capacity_factor, timeout=120)
    model = _model(num_experts, k, capacity_factor, groups=e)  # one routing group per rank's tokens
    x, t = _data(e)
    kept, _ = _train(model, model.layers[1], x, t)
    moe = model.layers[1]
    dropped_somewhere = False
    for rank, (params, rank_kept, sent) in enumerate(results):
        for step in range(STEPS):  # the same tokens reach an expert, the same are dropped
            np.testing.assert_array_equal(rank_kept[step], kept[step][rank * N:(rank + 1) * N])
            dropped_somewhere |= not rank_kept[step].all()
        for a, b in zip(params["0"], model.layers[0].parameters(), strict=True):
            np.testing.assert_allclose(a, b.data, rtol=0, atol=1e-12)
        for a, b in zip(params["2"], model.layers[2].parameters(), strict=True):
            np.testing.assert_allclose(a, b.data, rtol=0, atol=1e-12)
        np.testing.assert_allclose(params["router"], moe.router.weight.data, rtol=0, atol=1e-12)
        assert sorted(params["experts"]) == list(range(rank * per_rank, (rank + 1) * per_rank))
        for j, arrays in params["experts"].items():
            for a, b in zip(arrays, moe.experts[j].parameters(), strict=True):
                np.testing.assert_allclose(a, b.data, rtol=0, atol=1e-12, err_msg=f"expert {j}")
        for nbytes, n_out, n_in in sent:  # token all-to-alls (4 per step) + the counts all-to-all
            counts = (e - 1) * per_rank * 8
            assert nbytes == alltoall_bytes_sent(n_out, n_in, D, 8) + counts
    if capacity_factor < 1:
        assert dropped_somewhere


def _clock_worker(comm, hot_expert):
    model = _model(4, 1, 4.0, groups=1)
    moe = model.layers[1]
    moe.router.weight.data[...] = 0
    moe.router.weight.data[hot_expert, 0] = 50.0  # every token with x[:, 0] > 0 goes to the hot expert
    ep = ExpertParallelMoE(comm, moe)
    x = np.abs(np.random.default_rng(comm.rank).standard_normal((N, D)))
    y = ep.forward(x)
    ep.backward(np.ones_like(y))
    return comm.clock, int(ep._counts.sum())  # token rows this rank's experts processed


@pytest.mark.parametrize("hot_expert,busy_rank", [(3, 1), (0, 0)])
def test_the_busiest_expert_sets_the_step_on_the_clock(hot_expert, busy_rank):
    free = LinkModel(alpha=0.0, beta=0.0)  # communication costs nothing: the clock shows compute alone
    clocks, loads = zip(*run(_clock_worker, 2, hot_expert, link=free), strict=True)
    assert loads[busy_rank] == 2 * N and loads[1 - busy_rank] == 0
    # the idle rank waits for the busy one's outputs and gradients: both end at the slowest expert's time
    expected = expert_step_seconds(list(loads), D, D_FF, Device().flops)
    assert clocks == pytest.approx((expected, expected), rel=1e-12)
    assert imbalance(loads) == 2.0


def _bad_worker(comm, case):
    if case == "not divisible":
        ExpertParallelMoE(comm, MoE(D, D_FF, 3, rng=np.random.default_rng(0)))
    elif case == "not an MoE":
        ExpertParallelMoE(comm, Linear(D, D, rng=np.random.default_rng(0)))
    else:
        layer = ExpertParallelMoE(comm, MoE(D, D_FF, 2, rng=np.random.default_rng(0)))
        layer.forward(np.zeros((3, D + 1), dtype=np.float32))


@pytest.mark.parametrize("case,match", [("not divisible", "3 experts cannot be spread evenly over 2 ranks"),
                                        ("not an MoE", "wraps an nn.MoE"),
                                        ("wrong width", r"expects input \(n, 4\)")])
def test_bad_expert_parallel_input_is_a_clear_error(case, match):
    from minidist.cluster import ClusterError
    with pytest.raises(ClusterError, match=match):
        run(_bad_worker, 2, case)


def _one_step_worker(comm, num_experts, k, capacity_factor, n, seed):
    rng = np.random.default_rng(seed)
    moe = MoE(D, D_FF, num_experts, k, capacity_factor, 0.1, 0.01, rng=rng, dtype=np.float64)
    ep = ExpertParallelMoE(comm, moe)
    data = np.random.default_rng(seed + 1)
    x, dy = data.standard_normal((2, comm.world_size * n, D))
    rows = slice(comm.rank * n, (comm.rank + 1) * n)
    y = ep.forward(x[rows])
    dx = ep.backward(dy[rows])
    experts = {ep.first_expert + j: [p.grad for p in ex.parameters()] for j, ex in enumerate(ep.experts)}
    return y, dx, ep.router.weight.grad, experts


@settings(max_examples=8)
@given(e=st.sampled_from([1, 2, 3, 4]), per_rank=st.integers(1, 2), k=st.integers(1, 2),
       capacity_factor=st.sampled_from([0.5, 1.0, 2.5]), n=st.integers(1, 5), seed=st.integers(0, 100))
def test_expert_parallel_forward_and_backward_equal_one_process(e, per_rank, k, capacity_factor, n, seed):
    """Rank r's scalar is Σ dy·y over its tokens + α·aux_r + β·z_r; their sum over the ranks is one process's
    Σ dy·y + (e·α)·mean_r aux_r + (e·β)·mean z with groups = e: every gradient must match that."""
    num_experts = e * per_rank
    k = min(k, num_experts)
    results = run(_one_step_worker, e, num_experts, k, capacity_factor, n, seed, timeout=120)
    moe = MoE(D, D_FF, num_experts, k, capacity_factor, 0.1 * e, 0.01 * e, groups=e,
              rng=np.random.default_rng(seed), dtype=np.float64)
    data = np.random.default_rng(seed + 1)
    x, dy = data.standard_normal((2, e * n, D))
    y = moe.forward(x)
    dx = moe.backward(dy)
    np.testing.assert_allclose(np.concatenate([r[0] for r in results]), y, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([r[1] for r in results]), dx, rtol=0, atol=1e-11)
    np.testing.assert_allclose(sum(r[2] for r in results), moe.router.weight.grad, rtol=0, atol=1e-11)
    for _, _, _, experts in results:
        for j, grads in experts.items():
            for g, p in zip(grads, moe.experts[j].parameters(), strict=True):
                np.testing.assert_allclose(g, p.grad, rtol=0, atol=1e-11, err_msg=f"expert {j}")
