"""DistributedSampler: disjoint shards covering every index once per epoch, the same on every rank,
reshuffled per epoch; torch's own sampler as the oracle for the padding and striding."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.data.sampler import DistributedSampler, batched
from tests.data.sampler_diagnosis import diagnose_sampler

sampler_exercise = pytest.mark.exercise("distributed_sampler")


@sampler_exercise
@pytest.mark.diagnose
def test_every_rank_holds_its_stride_of_torchs_order():
    wrong = diagnose_sampler(DistributedSampler)
    assert wrong is None, wrong


def all_ranks(n, p, epoch=0, **kwargs) -> list[np.ndarray]:
    out = []
    for r in range(p):
        s = DistributedSampler(n, p, r, **kwargs)
        s.set_epoch(epoch)
        out.append(s.indices())
    return out


@sampler_exercise
@given(n=st.integers(1, 300), p=st.integers(1, 8), drop_last=st.booleans(), shuffle=st.booleans(),
       seed=st.integers(0, 2**31), epoch=st.integers(0, 50))
def test_every_index_exactly_once_per_epoch(n, p, drop_last, shuffle, seed, epoch):
    shards = all_ranks(n, p, epoch, drop_last=drop_last, shuffle=shuffle, seed=seed)
    per_rank = n // p if drop_last else -(-n // p)
    assert all(len(s) == per_rank for s in shards)                      # equal shards: no rank waits
    counts = np.bincount(np.concatenate(shards), minlength=n)
    if drop_last:
        assert set(np.unique(counts)) <= {0, 1} and counts.sum() == p * (n // p)   # disjoint, N mod P dropped
    else:
        assert counts.min() == 1 and counts.sum() == p * per_rank       # all covered, padding repeats
        assert (counts > 1).sum() <= p * per_rank - n
    assert all(s.dtype == np.int64 and ((0 <= s) & (s < n)).all() for s in shards)


@sampler_exercise
def test_drop_last_divisible_is_a_partition():
    shards = all_ranks(120, 8, 3, seed=5, drop_last=True)
    np.testing.assert_array_equal(np.sort(np.concatenate(shards)), np.arange(120))


@sampler_exercise
def test_same_order_on_every_rank_and_new_each_epoch():
    """Two processes built from the same (seed, epoch) agree; a new epoch or seed gives a new order."""
    a = all_ranks(100, 4, epoch=2, seed=7)
    b = all_ranks(100, 4, epoch=2, seed=7)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    c = all_ranks(100, 4, epoch=3, seed=7)
    d = all_ranks(100, 4, epoch=2, seed=8)
    assert not np.array_equal(np.concatenate(a), np.concatenate(c))
    assert not np.array_equal(np.concatenate(a), np.concatenate(d))
    # set_epoch is what changes it: iterating twice without it repeats the epoch
    s = DistributedSampler(100, 4, 1, seed=7)
    assert list(s) == list(s)
    first = list(s)
    s.set_epoch(1)
    assert list(s) != first and len(list(s)) == len(s) == 25


@sampler_exercise
def test_padding_wraps_around_and_strides():
    # N = 10, P = 4, no shuffle: order 0..9 padded with 0, 1 to 12; rank r takes r, r+4, r+8
    shards = all_ranks(10, 4, shuffle=False)
    assert [s.tolist() for s in shards] == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
    # N = 2, P = 5: the padding wraps around more than once
    assert [s.tolist() for s in all_ranks(2, 5, shuffle=False)] == [[0], [1], [0], [1], [0]]
    assert ([s.tolist() for s in all_ranks(10, 4, shuffle=False, drop_last=True)]
            == [[0, 4], [1, 5], [2, 6], [3, 7]])


@sampler_exercise
@given(n=st.integers(1, 60), p=st.integers(1, 8), drop_last=st.booleans())
def test_same_as_torch_without_shuffle(n, p, drop_last):
    torch_data = pytest.importorskip("torch.utils.data")
    for r in range(p):
        ours = DistributedSampler(n, p, r, shuffle=False, drop_last=drop_last)
        theirs = torch_data.DistributedSampler(range(n), num_replicas=p, rank=r, shuffle=False,
                                               drop_last=drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 2\)"):
        DistributedSampler(10, 2, 2)
    with pytest.raises(ValueError, match="num_replicas must be an integer >= 1"):
        DistributedSampler(10, 0, 0)
    with pytest.raises(ValueError, match="dataset_size must be an integer >= 0"):
        DistributedSampler(10.0, 2, 0)
    with pytest.raises(ValueError, match="empty dataset"):
        DistributedSampler(0, 2, 0)
    with pytest.raises(ValueError, match="epoch must be an integer >= 0"):
        DistributedSampler(10, 2, 0).set_epoch(-1)
    assert len(DistributedSampler(0, 2, 0, drop_last=True)) == 0
    assert len(DistributedSampler(3, 4, 3, drop_last=True)) == 0


def test_batched():
    idx = np.arange(10)
    assert [b.tolist() for b in batched(idx, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [b.tolist() for b in batched(idx, 4, drop_last=True)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        batched(idx, 0)
