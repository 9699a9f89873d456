"""A split module's ``flops`` counts the products its rank performs, and the t ranks' shares add up to the
unsplit module's count — exactly 1/t of it where t divides the heads and d_ff, which is what the grids'
clocks charge a split block (and the planner's minidist mode predicts).

No cluster is needed: the split modules only talk in forward/backward (and in one check that every rank
was given the same sizes, skipped here), so "rank q of t" is a two-field stand-in.
"""

from contextlib import ExitStack
from unittest import mock

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from minidist.cluster import Device
from minidist.nn import CausalSelfAttention, Embedding, Linear, MoE, TransformerBlock
from minidist.parallel.context import context_parallel
from minidist.parallel.expert import ExpertParallelMoE
from minidist.parallel.tensor import tensor_parallel
from minidist.parallel.tensor.attention import TensorParallelAttention
from minidist.parallel.tensor.mlp import MegatronMLP
from minidist.parallel.tensor.vocab_parallel import VocabParallelEmbedding, VocabParallelHead


class RankOf:
    """Rank ``rank`` of a group of ``world_size``, as far as building a split module needs."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size, self.device = rank, world_size, Device()


def same_everywhere():
    """Skip the all-gather that checks every rank was given the same sizes (one process builds them all)."""
    stack = ExitStack()
    for where in ("attention", "vocab_parallel", "layers"):
        stack.enter_context(mock.patch(f"minidist.parallel.tensor.{where}.check_same_on_all_ranks"))
    return stack


@st.composite
def dims(draw, even=False):
    """(t, B, T, heads, d_head, d_ff): t ranks, t <= heads; with even, t divides heads and d_ff."""
    t = draw(st.integers(1, 4))
    heads = t * draw(st.integers(1, 2)) if even else draw(st.integers(t, 5))
    d_ff = t * draw(st.integers(1, 3)) if even else draw(st.integers(t, 9))
    return t, draw(st.integers(1, 2)), draw(st.integers(1, 4)), heads, draw(st.integers(1, 3)), d_ff


def block(heads, d_head, d_ff):
    return TransformerBlock(heads * d_head, heads, d_ff, rng=np.random.default_rng(0), dtype=np.float64)


@given(dims())
def test_split_attention_counts_the_products_of_its_heads_and_the_shares_add_up(case):
    t, b, seq, heads, dk, _ = case
    d = heads * dk
    whole = CausalSelfAttention(d, heads, rng=np.random.default_rng(0), dtype=np.float64)
    shares = []
    with same_everywhere():
        for q in range(t):
            split = TensorParallelAttention(RankOf(q, t), whole)
            d_p = split.qkv.weight.shape[0] // 3              # this rank's channels of q (of k, of v)
            products = (2 * b * seq * split.qkv.weight.size       # x·W_qkvᵀ
                        + 2 * 2 * b * seq * seq * d_p             # q·kᵀ and P·v over its heads
                        + 2 * b * seq * split.proj.weight.size)   # O·W_projᵀ
            assert split.flops((b, seq, d)) == products
            sequence = TensorParallelAttention(RankOf(q, t), whole, sequence_parallel=True)
            assert sequence.flops((b, seq, d)) == split.flops((b, t * seq, d))   # gathered along T first
            shares.append(split.flops((b, seq, d)))
    assert sum(shares) == whole.flops((b, seq, d))


@given(dims())
def test_split_mlp_and_head_count_their_local_weights_and_the_shares_add_up(case):
    t, b, seq, heads, dk, d_ff = case
    d, vocab = heads * dk, d_ff + 1
    whole = block(heads, dk, d_ff)
    head = Linear(d, vocab, bias=False, rng=np.random.default_rng(1), dtype=np.float64)
    table = Embedding(vocab, d, rng=np.random.default_rng(2), dtype=np.float64)
    mlp_shares, head_shares = [], []
    with same_everywhere():
        for q in range(t):
            mlp = MegatronMLP.from_mlp(RankOf(q, t), whole.mlp)
            split_head = VocabParallelHead(RankOf(q, t), head)
            assert mlp.flops((b, seq, d)) == 2 * b * seq * (mlp.up.weight.size + mlp.down.weight.size)
            assert split_head.flops((b, seq, d)) == 2 * b * seq * split_head.weight.size
            assert VocabParallelEmbedding(RankOf(q, t), table).flops((b, seq)) == 0
            for sequence_parallel in (MegatronMLP.from_mlp(RankOf(q, t), whole.mlp, sequence_parallel=True),
                                      VocabParallelHead(RankOf(q, t), head, sequence_parallel=True)):
                unsplit = mlp if isinstance(sequence_parallel, MegatronMLP) else split_head
                assert sequence_parallel.flops((b, seq, d)) == unsplit.flops((b, t * seq, d))
            mlp_shares.append(mlp.flops((b, seq, d)))
            head_shares.append(split_head.flops((b, seq, d)))
    assert sum(mlp_shares) == whole.mlp[0].flops((b, seq, d)) + whole.mlp[2].flops((b, seq, d_ff))
    assert sum(head_shares) == head.flops((b, seq, d))


@given(dims(), st.booleans())
def test_split_blocks_price_their_share_and_exactly_one_t_th_when_t_divides(case, even):
    """tensor_parallel's block (then context_parallel's, over c ranks of the sequence) prices itself: the
    shares add up to the whole block's count on the same tokens; with t dividing the heads and d_ff each is
    whole // t, the price the grids charged when they kept an unsplit copy to count."""
    t, b, seq, heads, dk, d_ff = case
    if even:
        heads, d_ff = t * -(-heads // t), t * -(-d_ff // t)
    shape = (b, seq, heads * dk)
    expected = block(heads, dk, d_ff).flops(shape)
    for c in (1, 2):
        shares = []
        with same_everywhere():
            for q in range(t):
                split = tensor_parallel(block(heads, dk, d_ff), RankOf(q, t))
                if c > 1:
                    context_parallel(split, RankOf(0, c), seq_len=2 * c)
                shares.append(split.flops(shape))
        assert sum(shares) == expected
        if even:
            assert shares == [expected // t] * t


def test_an_expert_parallel_block_prices_its_attention_share_and_its_experts_charge_themselves():
    """The MoE's unit price is 0 (its experts charge the rows routing sends them as they run); the block's is
    its attention share, 1/t of the whole attention's: the Switch grid's price."""
    b, seq, d, t, e = 2, 3, 8, 2, 2
    for q in range(t):
        with same_everywhere():
            split = tensor_parallel(block(4, 2, 8), RankOf(q, t))
        split.mlp = MoE(d, 8, 4, rng=np.random.default_rng(0), dtype=np.float64)
        split.mlp = ExpertParallelMoE(RankOf(q % e, e), split.mlp)
        assert split.mlp.flops((b, seq, d)) == 0
        assert split.flops((b, seq, d)) == block(4, 2, 8).attn.flops((b, seq, d)) // t


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3))
def test_context_split_attention_prices_its_projections_on_its_tokens(c, heads, tokens):
    """Without a tensor split, context_parallel's attention prices its projections on this rank's tokens;
    its RingAttention core charges the key/value blocks it computes itself (test_parallel_context_ring.py)."""
    d = 2 * heads
    split = context_parallel(block(heads, 2, 4), RankOf(c - 1, c), seq_len=c * tokens, layout="naive").attn
    shape = (2, tokens, d)
    assert split.flops(shape) == split.qkv.flops(shape) + split.proj.flops(shape) == 8 * 2 * tokens * d * d
