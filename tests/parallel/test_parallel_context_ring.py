"""Ring attention on c = 1..4 ranks against attention computed in one process (float64).

Output and the gradients of q, k and v, causal and not, naive and zigzag splits, even and uneven; the
bytes and messages each rank sends equal cost.ring_traffic; the simulated clock shows the zigzag's
balance and the closed-form step time. The reference is plain softmax attention written out here, its
gradients checked by central differences and against PyTorch.
"""

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from minidist.cluster import Device, LinkModel, run
from minidist.nn.gradcheck import numerical_gradient, relative_error
from minidist.parallel.context import (
    RingAttention,
    causal_work,
    positions,
    ring_traffic,
    shard,
    step_seconds,
    unshard,
)

TOL = {"rtol": 1e-11, "atol": 1e-12}
CLUSTER_SETTINGS = settings(max_examples=6, phases=(Phase.explicit, Phase.reuse, Phase.generate))


def reference(q, k, v, causal):
    """softmax(q·kᵀ/√d_k + mask)·v in one process, the textbook way."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tri(q.shape[2], dtype=bool), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def _ring(comm, q, k, v, d_out, causal, layout, overlap=True, link=None):
    c, r = comm.world_size, comm.rank
    attn = RingAttention(comm, q.shape[2], causal=causal, layout=layout, overlap=overlap)
    out = attn.forward(*(shard(a, c, r, layout) for a in (q, k, v)))
    after_forward = (comm.stats.bytes_sent, comm.stats.messages_sent, comm.clock)
    grads = attn.backward(shard(d_out, c, r, layout))
    return out, grads, after_forward, comm.stats, attn.flops, comm.clock


def _data(seed, shape):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(4)]


@st.composite
def cases(draw):
    c = draw(st.integers(1, 4))
    layout = draw(st.sampled_from(["naive", "zigzag"]))
    pieces = c if layout == "naive" else 2 * c
    return {"c": c, "layout": layout, "causal": draw(st.booleans()), "seed": draw(st.integers(0, 2**16)),
            "shape": (draw(st.integers(1, 2)), draw(st.integers(1, 3)),
                      pieces + draw(st.integers(0, 2 * pieces)), draw(st.integers(1, 4)))}


@CLUSTER_SETTINGS
@given(cases())
def test_ring_attention_equals_full_attention(case):
    q, k, v, d_out = _data(case["seed"], case["shape"])
    c, layout, causal = case["c"], case["layout"], case["causal"]
    results = run(_ring, c, q, k, v, d_out, causal, layout)
    np.testing.assert_allclose(unshard([r[0] for r in results], layout), reference(q, k, v, causal), **TOL)
    expected = _reference_grads(q, k, v, d_out, causal)
    for i, name in enumerate("qkv"):
        got = unshard([r[1][i] for r in results], layout)
        assert relative_error(got, expected[name]) < 1e-9, name
    batch, heads, seq_len, d_k = case["shape"]
    for rank, (_, _, forward, stats, _, _) in enumerate(results):
        traffic = ring_traffic(seq_len, c, rank, batch, heads, d_k, 8, layout)
        assert forward[:2] == (traffic["forward_bytes"], traffic["forward_messages"])
        assert stats.bytes_sent == traffic["forward_bytes"] + traffic["backward_bytes"]
        assert stats.messages_sent == traffic["forward_messages"] + traffic["backward_messages"]
    assert sum(r[3].bytes_received for r in results) == sum(r[3].bytes_sent for r in results)


def _reference_grads(q, k, v, d_out, causal):
    """Gradients of Σ d_out ∘ reference(q, k, v) by the chain rule written out (checked below)."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tri(q.shape[2], dtype=bool), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    dp = d_out @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) / np.sqrt(q.shape[-1])
    return {"q": ds @ k, "k": np.swapaxes(ds, -1, -2) @ q, "v": np.swapaxes(p, -1, -2) @ d_out}


@pytest.mark.parametrize("causal", [False, True])
def test_reference_gradients_by_central_differences(causal):
    q, k, v, d_out = _data(3, (1, 2, 5, 3))
    grads = _reference_grads(q, k, v, d_out, causal)
    arrays = {"q": q, "k": k, "v": v}
    for name, a in arrays.items():
        def loss(a=a):
            return float((reference(arrays["q"], arrays["k"], arrays["v"], causal) * d_out).sum())
        assert relative_error(grads[name], numerical_gradient(loss, a)) < 1e-6, name


@pytest.mark.parametrize("causal", [False, True])
def test_reference_gradients_against_torch(causal):
    torch = pytest.importorskip("torch")
    q, k, v, d_out = _data(4, (2, 2, 6, 4))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
    out.backward(torch.tensor(d_out))
    np.testing.assert_allclose(out.detach().numpy(), reference(q, k, v, causal), **TOL)
    grads = _reference_grads(q, k, v, d_out, causal)
    for name, t in zip("qkv", (tq, tk, tv), strict=True):
        np.testing.assert_allclose(t.grad.numpy(), grads[name], **TOL)


@pytest.mark.parametrize("c", [2, 4])
def test_zigzag_balances_causal_work_and_the_clock(c):
    seq_len = 8 * c
    data = _data(5, (1, 2, seq_len, 4))
    naive = run(_ring, c, *data, True, "naive")
    zigzag = run(_ring, c, *data, True, "zigzag")
    zig_flops = [r[4] for r in zigzag]
    assert len(set(zig_flops)) == 1                                     # every rank the same work
    assert causal_work(seq_len, c, "zigzag") == [seq_len * (seq_len + 1) // (2 * c)] * c
    naive_work = causal_work(seq_len, c, "naive")
    tokens = seq_len // c
    assert naive_work == [i * tokens**2 + tokens * (tokens + 1) // 2 for i in range(c)]
    assert naive[-1][4] > naive[0][4] * (2 * c - 2)                     # the last rank does ~(2c−1)×
    forward_clock = lambda results: max(r[2][2] for r in results)
    assert forward_clock(zigzag) < forward_clock(naive)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("c,seq_len", [(1, 8), (2, 8), (3, 12), (4, 16), (4, 64)])
def test_clock_equals_the_closed_form(c, seq_len, overlap):
    batch, heads, d_k = 1, 2, 4
    data = _data(6, (batch, heads, seq_len, d_k))
    results = run(_ring, c, *data, False, "naive", overlap)
    forward, backward = step_seconds(seq_len, c, batch, heads, d_k, 8, overlap=overlap, link=LinkModel())
    for r in results:
        assert r[2][2] == pytest.approx(forward, rel=1e-12)
        assert r[5] == pytest.approx(forward + backward, rel=1e-12)
    if c > 1:
        other = step_seconds(seq_len, c, batch, heads, d_k, 8, overlap=not overlap)
        assert (forward < other[0]) == overlap



def _device_charge(comm):
    attn = RingAttention(comm, 8, causal=False)
    data = _data(8, (1, 2, 8, 4))
    attn.forward(*(shard(a, comm.world_size, comm.rank, "naive") for a in data[:3]))
    return attn.flops, attn.compute_seconds, comm.device.flops


def test_ring_attention_computes_at_the_runs_device():
    """Without device=, the blocks' FLOPs are charged at the device the run was given, like every layer."""
    slow = Device(flops=1e9)
    for flops, seconds, rate in run(_device_charge, 2, device=slow):
        assert rate == slow.flops and flops > 0 and seconds == pytest.approx(flops / slow.flops, rel=1e-12)

def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="need >= 8"):
        positions(7, 4, 0, "zigzag")
    with pytest.raises(ValueError, match="layout"):
        positions(8, 2, 0, "striped")

    def wrong_length(comm):
        attn = RingAttention(comm, 8, layout="zigzag")
        x = np.zeros((1, 1, 3, 2))
        with pytest.raises(ValueError, match="holds 4 tokens"):
            attn.forward(x, x, x)
        with pytest.raises(RuntimeError, match="before forward"):
            attn.backward(x)
        with pytest.raises(TypeError, match="float"):
            attn.forward(*(np.zeros((1, 1, 4, 2), dtype=int),) * 3)
    run(wrong_length, 2)
