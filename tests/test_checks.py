"""A size or count is an integer, never a bool (True == 1 in Python) and never a fraction that int() would
truncate: every size argument refuses True and 2.5 through minidist.nn.checks, with a ValueError that says
what was expected. Arrays of numbers refuse strings, objects and complex values, and NaN where it matters."""

from types import SimpleNamespace

import numpy as np
import pytest

from minidist import nn
from minidist.hardware.roofline import communication_intensity, layer_cost
from minidist.hardware.systolic import cycles
from minidist.nn.checks import check_count, check_rank, check_real, check_real_array, is_count
from minidist.parallel.asynchronous.momentum import least_squares
from minidist.parallel.compression import OneBit
from minidist.parallel.context import context_parallel
from minidist.parallel.context.layout import positions
from minidist.parallel.data.buckets import assign_buckets
from minidist.parallel.mesh import Mesh
from minidist.parallel.pipeline.boundaries import check_boundaries, split_by_layers
from minidist.parallel.tensor.comm import feature_bounds
from minidist.parallel.tensor.cost import megatron_words
from minidist.parallel.tensor.sequence import sequence_shard
from minidist.sim.collective_rounds import schedule

RNG = np.random.default_rng(0)
COMM4 = SimpleNamespace(rank=0, world_size=4)

BOOL_AS_SIZE = {
    "Mesh data × pipeline × tensor": lambda: Mesh(COMM4, data=True, pipeline=2, tensor=2),
    "Mesh (data × tensor)": lambda: Mesh(SimpleNamespace(rank=0, world_size=1), tensor=True),
    "Linear": lambda: nn.Linear(True, 3, rng=RNG),
    "Conv2d kernel": lambda: nn.Conv2d(1, 2, True, rng=RNG),
    "MaxPool2d": lambda: nn.MaxPool2d(True),
    "BatchNorm1d": lambda: nn.BatchNorm1d(True),
    "LayerNorm": lambda: nn.LayerNorm(True),
    "GroupNorm": lambda: nn.GroupNorm(True, 2),
    "OnlineNorm": lambda: nn.OnlineNorm(True),
    "OneBit shape": lambda: OneBit([(True, 3)]),
    "schedule": lambda: schedule("ring", True),
    "bucket_bytes": lambda: assign_buckets(nn.Linear(2, 2, rng=RNG).parameters(), True),
    "pipeline boundaries": lambda: check_boundaries([0, True, 2], 2, 2),
    "pipeline stages": lambda: split_by_layers(2, True),
    "tensor shards": lambda: feature_bounds(4, True),
    "tensor cost": lambda: megatron_words([4, 4, 4], True, 2),
    "roofline shape": lambda: layer_cost(nn.ReLU(), (True, 3)),
    "roofline batch": lambda: communication_intensity([4, 4], True, "data", 2),
    "least_squares": lambda: least_squares(True, 1, 2.0, rng=RNG),
    "GPT n_layers": lambda: nn.GPT(5, 4, True, 8, 2, rng=RNG),
    "LSTM input_size": lambda: nn.LSTM(True, 4, rng=RNG),
    "Embedding": lambda: nn.Embedding(True, 4, rng=RNG),
    "MoE groups": lambda: nn.MoE(4, 8, 2, groups=True, rng=RNG),
    "systolic array size": lambda: cycles(4, 4, 4, True),
}

GPT = nn.GPT(5, 8, 1, 8, 2, rng=RNG)

# Each of these used to run as if int() of the size had been given (GPT(5, 2.5, ...) built block_size 2).
FRACTION_AS_SIZE = {
    "GPT block_size": lambda: nn.GPT(5, 2.5, 1, 8, 2, rng=RNG),
    "GPT d_model": lambda: nn.GPT(5, 4, 1, 8.5, 2, rng=RNG),
    "CausalSelfAttention d_model": lambda: nn.CausalSelfAttention(8.5, 2, rng=RNG),
    "TransformerBlock d_ff": lambda: nn.TransformerBlock(8, 2, 16.5, rng=RNG),
    "RNN hidden_size": lambda: nn.RNN(3, 4.5, rng=RNG),
    "MoE d_ff": lambda: nn.MoE(4, 8.5, 2, rng=RNG),
    "Embedding embedding_dim": lambda: nn.Embedding(5, 4.5, rng=RNG),
    "generate max_new_tokens": lambda: GPT.generate(np.array([[1]]), 2.5, rng=np.random.default_rng(0)),
    "generate top_k": lambda: GPT.generate(np.array([[1]]), 2, top_k=1.5, rng=np.random.default_rng(0)),
    "context positions seq_len": lambda: positions(7.5, 2, 0),
    "context_parallel seq_len": lambda: context_parallel(GPT, COMM4, seq_len=7.5),
    "sequence_shard parts": lambda: sequence_shard(np.zeros((1, 4, 2)), 2.0, 0),
}


@pytest.mark.parametrize("case", sorted(BOOL_AS_SIZE))
def test_a_bool_is_not_a_size(case):
    with pytest.raises(ValueError, match="int"):
        BOOL_AS_SIZE[case]()


@pytest.mark.parametrize("case", sorted(FRACTION_AS_SIZE))
def test_a_fraction_is_not_a_size(case):
    with pytest.raises(ValueError, match=r"must be an integer >= \d, got \d+\.\d"):
        FRACTION_AS_SIZE[case]()


def test_the_shared_checks():
    assert is_count(3) and is_count(np.int64(0), 0) and not is_count(True) and not is_count(2.0)
    assert check_count(np.int32(5), "n") == 5 and type(check_count(np.int32(5), "n")) is int
    with pytest.raises(ValueError, match=r"n must be an integer >= 1, got True \(a bool is not a count\)"):
        check_count(True, "n")
    with pytest.raises(ValueError, match="n must be an integer >= 0, got -1"):
        check_count(-1, "n", 0)
    assert check_real(np.float32(2), "x", 0.0) == 2.0
    with pytest.raises(TypeError, match="x must be a real number, got str"):
        check_real("1", "x")
    with pytest.raises(ValueError, match="x must be a finite number > 0"):
        check_real(0.0, "x", 0.0, strict=True)
    with pytest.raises(ValueError, match="finite"):
        check_real(float("nan"), "x")
    assert check_rank(np.int64(3), 4) == 3
    for bad in (4, -1, 1.0, True):
        with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 4\)"):
            check_rank(bad, 4)
    assert check_real_array([1, 2], "a").dtype.kind == "i"
    for bad in (np.array(["a"]), np.array([None]), np.array([1j]), np.array([True])):
        with pytest.raises(TypeError, match="a must be an array of real numbers"):
            check_real_array(bad, "a")
    check_real_array(np.array([np.inf]), "a")                    # finite only when asked
    with pytest.raises(ValueError, match=r"a must be finite, got 2 NaN or infinite value\(s\) of 3"):
        check_real_array(np.array([np.nan, 1.0, -np.inf]), "a", finite=True)
