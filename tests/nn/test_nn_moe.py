"""The mixture-of-experts MLP: PyTorch autograd of the same computation (capacity dropping included),
finite differences of the whole loss (balance and z-losses included), one expert = the plain MLP, the
counts of dropped tokens, and bad input."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import nn
from minidist.nn.gradcheck import numerical_gradient, relative_error
from minidist.nn.moe import expert_mlp
from minidist.nn.moe_router import route

D, D_FF = 4, 6


def make(num_experts=4, k=1, capacity_factor=1.0, groups=1, aux=0.01, z=0.0, seed=0):
    rng = np.random.default_rng(seed)
    return nn.MoE(D, D_FF, num_experts, k, capacity_factor, aux, z, groups, rng=rng, dtype=np.float64)


def torch_loss(torch, moe, x, dy):
    """The same computation written with torch tensors, decisions included (topk, cumsum capacity)."""
    F = torch.nn.functional
    params = {name: torch.tensor(p.data, requires_grad=True) for name, p in moe.named_parameters()}
    tx = torch.tensor(x, requires_grad=True)
    x2 = tx.reshape(-1, D)
    n, e, k = x2.shape[0], moe.num_experts, moe.k
    logits = x2 @ params["router.weight"].T
    p = torch.softmax(logits, dim=1)
    top_p, top_i = torch.topk(p, k, dim=1)
    gates = top_p if k == 1 else top_p / top_p.sum(dim=1, keepdim=True)
    s = n // moe.groups
    cap = math.ceil(k * moe.capacity_factor * s / e)     # GShard's / DeepSpeed's top2gating: k·cf·S/E
    kept = torch.zeros(n, k, dtype=torch.bool)
    aux = 0
    for g in range(moe.groups):
        used = torch.zeros(e, dtype=torch.int64)
        for c in range(k):
            onehot = F.one_hot(top_i[g * s:(g + 1) * s, c], e)
            position = ((torch.cumsum(onehot, 0) - 1 + used) * onehot).sum(1)
            kept[g * s:(g + 1) * s, c] = position < cap
            used = used + onehot.sum(0)
        f = F.one_hot(top_i[g * s:(g + 1) * s, 0], e).double().mean(0)
        aux = aux + e * (f.detach() * p[g * s:(g + 1) * s].mean(0)).sum() / moe.groups
    y = torch.zeros_like(x2)
    for j in range(e):
        w1, b1 = params[f"experts.{j}.layers.0.weight"], params[f"experts.{j}.layers.0.bias"]
        w2, b2 = params[f"experts.{j}.layers.2.weight"], params[f"experts.{j}.layers.2.bias"]
        out = F.gelu(x2 @ w1.T + b1) @ w2.T + b2  # every token; the mask keeps the routed ones
        weight = ((top_i == j) & kept).double() * gates
        y = y + weight.sum(1, keepdim=True) * out
    z = (torch.logsumexp(logits, dim=1) ** 2).mean()
    loss = (y.reshape(x.shape) * torch.from_numpy(dy)).sum() + moe.aux_loss_coef * aux + moe.z_loss_coef * z
    loss.backward()
    return (y.reshape(x.shape).detach().numpy(), tx.grad.numpy(),
            {k_: v.grad.numpy() for k_, v in params.items()}, float(aux.detach()), float(z.detach()),
            kept.numpy())


@pytest.mark.parametrize("k,capacity_factor,groups,z,shape", [
    (1, 0.5, 1, 0.0, (12, D)), (1, 1.0, 2, 1e-2, (2, 6, D)), (1, 4.0, 1, 0.0, (8, D)),
    (2, 0.75, 1, 1e-2, (12, D)), (2, 1.0, 3, 0.0, (3, 4, D)), (2, 3.0, 2, 0.0, (8, D)),
])
def test_moe_matches_torch_autograd(k, capacity_factor, groups, z, shape):
    torch = pytest.importorskip("torch")
    moe = make(k=k, capacity_factor=capacity_factor, groups=groups, aux=0.1, z=z, seed=k + groups)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape)
    dy = rng.standard_normal(shape)
    y = moe.forward(x)
    dx = moe.backward(dy)
    ty, tdx, tgrads, aux, zl, kept = torch_loss(torch, moe, x, dy)
    np.testing.assert_array_equal(moe.routing.kept, kept)
    if capacity_factor < 1:
        assert moe.routing.dropped_assignments > 0  # the case really drops
    np.testing.assert_allclose(y, ty, rtol=0, atol=1e-12)
    np.testing.assert_allclose(dx, tdx, rtol=0, atol=1e-10)
    assert abs(moe.aux_loss - aux) < 1e-12 and abs(moe.z_loss - zl) < 1e-12
    for name, p in moe.named_parameters():
        np.testing.assert_allclose(p.grad, tgrads[name], rtol=0, atol=1e-10, err_msg=name)


@pytest.mark.parametrize("k,capacity_factor", [(1, 0.75), (2, 0.75), (2, 2.0)])
def test_moe_finite_differences_of_the_whole_loss(k, capacity_factor):
    moe = make(k=k, capacity_factor=capacity_factor, aux=0.3, z=0.1, seed=5)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((10, D))
    dy = rng.standard_normal((10, D))

    def loss() -> float:
        return float(np.sum(dy * moe.forward(x))) + moe.loss

    moe.forward(x)
    kept = moe.routing.kept.copy()
    dx = moe.backward(dy)
    assert relative_error(dx, numerical_gradient(loss, x)) < 1e-6
    for name, p in moe.named_parameters():
        assert relative_error(p.grad, numerical_gradient(loss, p.data)) < 1e-6, name
    np.testing.assert_array_equal(moe.routing.kept, kept)  # the differences did not change a decision


def test_moe_one_expert_with_room_for_all_is_the_plain_mlp():
    moe = make(num_experts=1, capacity_factor=1.0, seed=3)
    mlp = copy.deepcopy(moe.experts[0])
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal((2, 5, D)), rng.standard_normal((2, 5, D))
    np.testing.assert_allclose(moe.forward(x), mlp.forward(x), rtol=0, atol=1e-14)
    np.testing.assert_allclose(moe.backward(dy), mlp.backward(dy), rtol=0, atol=1e-14)
    for p, q in zip(moe.experts[0].parameters(), mlp.parameters(), strict=True):
        np.testing.assert_allclose(p.grad, q.grad, rtol=0, atol=1e-14)
    assert not moe.router.weight.grad.any()  # softmax over one expert is 1: nothing to learn
    assert moe.routing.dropped_tokens == 0 and moe.aux_loss == 1.0


def test_moe_counts_dropped_tokens_and_they_give_zero():
    moe = make(num_experts=4, capacity_factor=1.0, seed=0)
    moe.router.weight.data[...] = 0
    moe.router.weight.data[2, 0] = 10.0  # every token with x[:, 0] > 0 prefers expert 2
    x = np.abs(np.random.default_rng(0).standard_normal((8, D)))
    y = moe.forward(x)
    r = moe.routing
    assert r.capacity == 2 and list(r.tokens_per_expert()) == [0, 0, 2, 0]
    assert r.dropped_tokens == 6 and list(np.nonzero(~r.kept[:, 0])[0]) == [2, 3, 4, 5, 6, 7]
    assert not y[2:].any() and y[:2].any()  # first come, first served; the rest pass through as 0


def test_moe_top2_second_choices_fill_free_slots_after_all_first_choices():
    logits = np.array([[3.0, 2, 0], [3, 2, 0], [0, 3, 2], [2, 0, 3]])
    r = route(logits, k=2, capacity_factor=0.5)  # C = ceil(2 · 0.5 · 4/3) = 2
    np.testing.assert_array_equal(r.experts, [[0, 1], [0, 1], [1, 2], [2, 0]])
    np.testing.assert_array_equal(r.kept, [[True, True], [True, False], [True, True], [True, False]])
    np.testing.assert_allclose(r.gates.sum(axis=1), 1.0)


@pytest.mark.parametrize("kwargs,match", [
    ({"num_experts": 2, "k": 3}, "1 <= k <= num_experts"), ({"capacity_factor": 0.0}, "capacity_factor"),
    ({"capacity_factor": -1.0}, "capacity_factor"), ({"capacity_factor": float("nan")}, "capacity_factor"),
    ({"groups": 0}, "groups"), ({"num_experts": 0}, "num_experts"), ({"aux": -1.0}, "aux_loss_coef"),
])
def test_moe_refuses_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


def test_moe_refuses_bad_input_before_changing_anything():
    moe = make(groups=2)
    x = np.random.default_rng(0).standard_normal((6, D))
    moe.forward(x)
    routing = moe.routing
    for bad, error in [(x[:0], ValueError), (x[:5], ValueError), (x[:, :3], ValueError), (x[0], ValueError),
                       (x.astype(np.int64), TypeError)]:
        with pytest.raises(error):
            moe.forward(bad)
        assert moe.routing is routing
    with pytest.raises(ValueError, match="do not split"):
        route(np.zeros((5, 4)), 1, 1.0, groups=2)


def test_expert_mlp_is_linear_gelu_linear():
    mlp = expert_mlp(3, 5, rng=np.random.default_rng(0), dtype=np.float32)
    assert [type(layer) for layer in mlp.layers] == [nn.Linear, nn.GELU, nn.Linear]
    assert mlp.layers[0].weight.shape == (5, 3) and mlp.layers[2].weight.shape == (3, 5)


def test_switch_transformer_finite_differences_router_losses_included():
    rng = np.random.default_rng(6)
    model = nn.SwitchTransformer(6, 4, 2, 4, 2, num_experts=2, d_ff=5, k=1, capacity_factor=0.75,
                                 aux_loss_coef=0.2, z_loss_coef=0.1, rng=rng, dtype=np.float64)
    tokens = rng.integers(0, 6, (2, 4))
    dy = rng.standard_normal((2, 4, 6))

    def loss() -> float:
        return float(np.sum(dy * model.forward(tokens))) + model.router_loss

    model.forward(tokens)
    assert all(isinstance(b.mlp, nn.MoE) for b in model.blocks)
    assert sum(b.mlp.routing.dropped_assignments for b in model.blocks) > 0  # capacity 0.75 drops some
    model.zero_grad()
    model.backward(dy)
    for name, p in model.named_parameters():
        assert relative_error(p.grad, numerical_gradient(loss, p.data)) < 1e-6, name
    with pytest.raises(ValueError, match="expected shape"):
        model.forward(rng.integers(0, 6, (2, 5)))


def test_switch_transformer_flops_per_token_count_k_experts_not_all():
    def make_model(e, k=1):
        return nn.SwitchTransformer(11, 8, 2, 8, 2, num_experts=e, d_ff=32, k=k, rng=np.random.default_rng(0))
    one, many, two = make_model(1), make_model(16), make_model(16, k=2)
    assert many.num_parameters() > 10 * one.num_parameters() // 2
    router = 6 * 2 * 8 * 15  # 15 more router columns per layer, forward + backward
    assert many.flops_per_token(8)["total"] - one.flops_per_token(8)["total"] == router
    assert two.flops_per_token(8)["6N"] - many.flops_per_token(8)["6N"] == 6 * 2 * 2 * 8 * 32


@given(k=st.integers(1, 4), experts=st.integers(4, 8), tokens=st.integers(1, 40),
       factor=st.sampled_from([0.5, 1.0, 1.25, 2.0]))
def test_capacity_is_k_times_the_factor_times_tokens_over_experts(k, experts, tokens, factor):
    """C = ⌈k · cf · S / E⌉ (GShard; DeepSpeed's top2gating): k·S assignments share the E experts."""
    logits = np.random.default_rng(tokens).standard_normal((tokens, experts))
    assert route(logits, k=k, capacity_factor=factor).capacity == math.ceil(k * factor * tokens / experts)


def test_top2_perfectly_balanced_drops_nothing_at_factor_one():
    """Every expert gets exactly 2S/E assignments: with C = 2·cf·S/E nothing drops at cf = 1; the top-1
    formula cf·S/E would leave room for only half of them (1 − cf/2 dropped: 37.5% at cf = 1.25)."""
    e, s = 4, 16
    logits = np.zeros((s, e))
    for t in range(s):                       # first choice t mod 4, second (t + 1) mod 4: balanced
        logits[t, t % e], logits[t, (t + 1) % e] = 2.0, 1.0
    r = route(logits, k=2, capacity_factor=1.0)
    assert list(r.tokens_per_expert()) == [2 * s // e] * e and r.dropped_assignments == 0
    cap_top1_formula = math.ceil(1.25 * s / e)
    assert 1 - e * cap_top1_formula / (2 * s) >= 0.375 - 1e-12
    assert route(logits, 2, 1.25).dropped_assignments == 0


def test_gshard_random_second_dispatch():
    """The second choice goes out with probability 2·g₂; skipped choices take no slot and are not drops;
    the same rng seed gives the same decisions; first choices are never skipped."""
    logits = np.random.default_rng(0).standard_normal((4000, 8))
    r = route(logits, k=2, capacity_factor=4.0, second_expert="random", rng=np.random.default_rng(1))
    dispatched = ~r.skipped[:, 1]
    assert not r.skipped[:, 0].any() and r.dropped_assignments == 0
    assert np.array_equal(r.kept[:, 1], dispatched)
    expected, n = 2 * r.gates[:, 1], len(logits)
    # the dispatch rate matches E[2·g₂] within 4 standard errors of a sum of Bernoulli draws
    assert abs(dispatched.mean() - expected.mean()) < 4 * np.sqrt((expected * (1 - expected)).sum()) / n
    again = route(logits, k=2, capacity_factor=4.0, second_expert="random", rng=np.random.default_rng(1))
    assert np.array_equal(again.skipped, r.skipped)
    moe = nn.MoE(D, D_FF, 4, k=2, second_expert="random", rng=np.random.default_rng(2), dtype=np.float64)
    x = np.random.default_rng(3).standard_normal((64, D))
    moe.forward(x)
    assert 0 < moe.routing.skipped[:, 1].sum() < 64
    with pytest.raises(ValueError, match="needs k = 2"):
        route(logits, k=1, capacity_factor=1.0, second_expert="random", rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        route(logits, k=2, capacity_factor=1.0, second_expert="random")
    with pytest.raises(ValueError, match="second_expert"):
        route(logits, k=2, capacity_factor=1.0, second_expert="sometimes")
    with pytest.raises(ValueError, match="route logits"):
        route(logits[0], k=1, capacity_factor=1.0)
