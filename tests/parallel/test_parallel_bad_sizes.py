"""Ranks and sizes of the sequence splits, and an expert-parallel rank with no tokens: clear errors, never an
empty piece, a ZeroDivisionError or a NaN balance loss."""

import numpy as np
import pytest

from minidist.cluster import ClusterError, run
from minidist.nn import MoE
from minidist.parallel.context.layout import positions
from minidist.parallel.expert import ExpertParallelMoE
from minidist.parallel.tensor.sequence import sequence_shard

X = np.arange(8.0).reshape(1, 4, 2)


@pytest.mark.parametrize("parts,rank,match", [
    (2, 2, r"sequence_shard rank must be an integer in \[0, 2\), got 2"),
    (2, -1, r"sequence_shard rank must be an integer in \[0, 2\), got -1"),
    (2, 0.0, r"sequence_shard rank must be an integer in \[0, 2\), got 0.0"),
    (0, 0, "sequence_shard parts must be an integer >= 1, got 0"),
    (True, 0, "sequence_shard parts must be an integer >= 1, got True"),
])
def test_sequence_shard_refuses_bad_ranks_and_sizes(parts, rank, match):
    with pytest.raises(ValueError, match=match):
        sequence_shard(X, parts, rank)


def test_sequence_shards_still_cover_the_sequence():
    assert np.array_equal(np.concatenate([sequence_shard(X, 2, r) for r in range(2)], axis=1), X)


@pytest.mark.parametrize("seq_len,parts,rank,match", [
    (8, 2, 2, r"rank must be an integer in \[0, 2\)"), (8, 2.0, 0, "parts must be an integer >= 1"),
    (8.0, 2, 0, "seq_len must be an integer >= 1"), (True, 1, 0, "seq_len must be an integer >= 1"),
])
def test_context_positions_refuse_bad_sizes(seq_len, parts, rank, match):
    with pytest.raises(ValueError, match=match):
        positions(seq_len, parts, rank)


def _rank_one_has_no_tokens(comm):
    layer = ExpertParallelMoE(comm, MoE(4, 6, 2, rng=np.random.default_rng(0)))
    layer.forward(np.zeros((3 if comm.rank == 0 else 0, 4), np.float32))


def test_an_expert_parallel_rank_with_no_tokens_is_a_clear_error():
    """A rank's tokens are its routing group and the balance loss a mean over them: with none it is 0/0, so
    the rank stops at routing (before any all-to-all), as nn.MoE refuses 0 tokens."""
    with pytest.raises(ClusterError, match=r"rank 1(.|\n)*routing needs at least one token"):
        run(_rank_one_has_no_tokens, 2, timeout=60)


def test_expert_parallel_refuses_gshards_random_second_dispatch():
    """Its draws are not split over ranks the way one process makes them: refused, not silently ignored."""

    class OneRank:
        rank, world_size = 0, 1

    moe = MoE(4, 8, 2, k=2, second_expert="random", rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="second_expert"):
        ExpertParallelMoE(OneRank(), moe)
