"""Codecs: message sizes equal the formulas (and the cluster ledger), decoding is what the formula says."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.cluster import run
from minidist.parallel.compression import DGC, Dense, OneBit, TopK, warmup_density
from minidist.precision import DynamicLossScaler

shapes_st = st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=2).map(tuple), min_size=1, max_size=3)


@given(shapes=shapes_st, per=st.sampled_from(["tensor", "column"]), seed=st.integers(0, 2**16))
def test_one_bit_size_and_group_sums(shapes, per, seed):
    codec = OneBit(shapes, per=per, dtype=np.float64)
    x = np.random.default_rng(seed).standard_normal(codec.n)
    message = codec.encode(x)
    assert message.dtype == np.uint8 and message.nbytes == (codec.n + 7) // 8 + 2 * codec.groups * 8
    decoded = codec.decode(message)
    assert np.array_equal(np.sign(decoded) >= 0, x >= 0) or np.all((decoded >= 0) == (x >= 0))
    sums = np.bincount(codec.group, weights=x, minlength=codec.groups)  # each group keeps its sum
    np.testing.assert_allclose(
        np.bincount(codec.group, weights=decoded, minlength=codec.groups), sums, atol=1e-12
    )


def send_one(comm, shapes, per):
    codec = OneBit(shapes, per=per)
    if comm.rank == 0:
        comm.send(codec.encode(np.random.default_rng(0).standard_normal(codec.n).astype(np.float32)), 1)
    else:
        comm.recv(0)
    return comm.stats.bytes_sent, codec.n, codec.groups


@pytest.mark.parametrize("per", ["tensor", "column"])
def test_packed_bits_are_32x_smaller_than_float32_plus_scales_in_the_ledger(per):
    shapes = [(16, 8), (16,), (4, 16), (16,)]
    (sent, n, groups), _ = run(send_one, 2, shapes, per)
    assert n % 8 == 0
    assert sent == 4 * n // 32 + 2 * groups * 4


@given(n=st.integers(1, 50), data=st.data())
def test_topk_message_and_selection(n, data):
    k = data.draw(st.integers(1, n))
    signs = np.array(data.draw(st.lists(st.sampled_from([-1, 1]), min_size=n, max_size=n)))
    x = ((np.array(data.draw(st.permutations(range(n)))) + 1) * signs).astype(np.float32)   # distinct |x|
    codec = TopK(n, k=k)
    message = codec.encode(x)
    assert message.nbytes == k * 8 == codec.message_bytes
    decoded = codec.decode(message)
    largest = np.argsort(-np.abs(x))[:k]
    want = np.zeros_like(x)
    want[largest] = x[largest]
    assert np.array_equal(decoded, want)


def test_dense_is_the_bytes_themselves():
    x = np.arange(6, dtype=np.float32)
    codec = Dense(6)
    assert codec.encode(x).nbytes == 24 and np.array_equal(codec.decode(codec.encode(x)), x)


def test_warmup_density_falls_exponentially():
    assert warmup_density(0, 4, 0.001) == 0.25
    assert warmup_density(4, 4, 0.001) == warmup_density(9, 4, 0.001) == 0.001
    d = [warmup_density(s, 4, 0.001) for s in range(5)]
    assert np.allclose(np.diff(np.log(d)), np.log(0.004) / 4)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="0 < k <= n"):
        TopK(10, k=0)
    with pytest.raises(ValueError, match="0 < k <= n"):
        TopK(10, k=11)
    with pytest.raises(ValueError, match="exactly one"):
        TopK(10)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        TopK(10, ratio=1.5)
    with pytest.raises(ValueError, match="per must be"):
        OneBit([(3,)], per="row")
    with pytest.raises(ValueError, match="shape"):
        OneBit([(3,)]).encode(np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="float32 or float64"):
        TopK(4, k=1, dtype=np.int32)
    with pytest.raises(ValueError, match="momentum"):
        DGC(10, 0.1, momentum=1.0)
    with pytest.raises(ValueError, match="final <= start"):
        warmup_density(0, 3, 0.5, start=0.25)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("codec", [OneBit([(2, 3), (4,)], per="column"), OneBit([(10,)]), TopK(10, k=10)])
def test_non_finite_gradients_stay_visible_so_a_loss_scaler_skips_the_step(codec, bad):
    x = np.random.default_rng(0).standard_normal(codec.n).astype(np.float32)
    x[4] = bad
    decoded = codec.decode(codec.encode(x))
    assert not np.isfinite(decoded[4])
    scaler = DynamicLossScaler(init_scale=8.0)
    found_inf = scaler.unscale([decoded])
    scaler.update(found_inf)
    assert found_inf and scaler.scale == 4.0
    clean = codec.decode(codec.encode(np.where(np.isfinite(x), x, 1).astype(np.float32)))
    assert np.isfinite(clean).all()        # an empty side (all one sign) still decodes to finite values


@pytest.mark.parametrize("bad", [10, 11, -1])
def test_topk_decode_refuses_an_index_outside_the_gradient(bad):
    codec = TopK(10, k=2)
    message = codec.encode(np.arange(10, dtype=np.float32))
    message[-4:] = np.array([bad], np.int32).view(np.uint8)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 10\)"):
        codec.decode(message)
