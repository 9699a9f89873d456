"""Vocabulary-parallel embedding and cross-entropy on t = 1..4 ranks against the single-process layers.

The loss and every logit's gradient equal nn.CrossEntropyLoss's (float64, large logits included); the
embedding's output and each rank's rows of the gradient equal nn.Embedding's; a small language model
(embedding → vocabulary-parallel head → loss) trains with AdamW to the same parameters as one process.
Bytes and messages per rank equal the docstring's formulas.
"""

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from minidist.cluster import ClusterError, run
from minidist.nn import CrossEntropyLoss, Embedding, Linear
from minidist.optim import AdamW
from minidist.parallel.tensor import (
    ColumnParallelLinear,
    VocabParallelCrossEntropy,
    VocabParallelEmbedding,
    feature_slice,
)

TOL = {"rtol": 1e-11, "atol": 1e-13}
CLUSTER_SETTINGS = settings(max_examples=5, phases=(Phase.explicit, Phase.reuse, Phase.generate))


def _loss_on_ranks(comm, logits, target):
    cols = feature_slice(logits.shape[-1], comm.world_size, comm.rank)
    loss_fn = VocabParallelCrossEntropy(comm, logits.shape[-1])
    loss = loss_fn.forward(logits[..., cols].copy(), target)
    return loss, loss_fn.backward(), comm.stats


def _reference(logits, target):
    """Mean softmax cross-entropy and its gradient in one process, written out (float64)."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    onehot = np.eye(logits.shape[-1])[target]
    return -(log_probs * onehot).sum() / target.size, (np.exp(log_probs) - onehot) / target.size


def test_the_reference_is_nn_cross_entropy():
    rng = np.random.default_rng(0)
    logits, target = 50 * rng.standard_normal((2, 3, 7)), rng.integers(0, 7, (2, 3))
    loss_fn = CrossEntropyLoss()
    want, want_grad = _reference(logits, target)
    assert loss_fn.forward(logits, target) == pytest.approx(want, rel=1e-13)
    np.testing.assert_allclose(loss_fn.backward(), want_grad, **TOL)


@CLUSTER_SETTINGS
@given(t=st.integers(1, 4), extra=st.integers(0, 5), n=st.integers(1, 9), seq=st.booleans(),
       scale=st.sampled_from([1.0, 300.0]), seed=st.integers(0, 2**16))
def test_vocab_parallel_cross_entropy_equals_one_process(t, extra, n, seq, scale, seed):
    rng = np.random.default_rng(seed)
    vocab = t + extra                                       # any V >= t: uneven splits included
    shape = (2, n) if seq else (n,)
    logits, target = scale * rng.standard_normal((*shape, vocab)), rng.integers(0, vocab, shape)
    want, want_grad = _reference(logits, target)
    results = run(_loss_on_ranks, t, logits, target)
    tokens = int(np.prod(shape))
    for rank, (loss, grad, stats) in enumerate(results):
        assert loss == pytest.approx(want, rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(grad, want_grad[..., feature_slice(vocab, t, rank)], **TOL)
        assert stats.messages_sent == 6 * (t - 1)
        if tokens % t == 0:
            assert stats.bytes_sent == 6 * (t - 1) * tokens // t * 8
    assert sum(r[2].bytes_sent for r in results) == 6 * (t - 1) * tokens * 8


def _embedding_on_ranks(comm, vocab, dim, seed, tokens, dy):
    table = Embedding(vocab, dim, rng=np.random.default_rng(seed), dtype=np.float64)
    layer = VocabParallelEmbedding(comm, table)
    before = comm.stats.bytes_sent                          # building checked the shapes agree (16 bytes)
    y = layer.forward(tokens)
    layer.backward(dy)
    return y, layer.weight.grad, comm.stats.bytes_sent - before


@CLUSTER_SETTINGS
@given(t=st.integers(1, 4), extra=st.integers(0, 5), seed=st.integers(0, 2**16))
def test_vocab_parallel_embedding_equals_one_process(t, extra, seed):
    vocab, dim = t + extra, 3
    rng = np.random.default_rng(seed + 1)
    tokens = rng.integers(0, vocab, (2, 4 * t))             # repeated ids: their gradients add up
    dy = rng.standard_normal((*tokens.shape, dim))
    full = Embedding(vocab, dim, rng=np.random.default_rng(seed), dtype=np.float64)
    want = full.forward(tokens)
    full.backward(dy)
    for rank, (y, grad, sent) in enumerate(run(_embedding_on_ranks, t, vocab, dim, seed, tokens, dy)):
        np.testing.assert_array_equal(y, want)              # each row comes from one rank: exact
        np.testing.assert_allclose(grad, full.weight.grad[feature_slice(vocab, t, rank)], **TOL)
        assert sent == 2 * (t - 1) * tokens.size * dim // t * 8     # one all-reduce forward, none backward


def _language_model(comm, vocab, dim, seed, batches, steps):
    """Embedding → vocabulary-parallel head → vocabulary-parallel loss; AdamW. Returns each step's loss
    and the final parameters of this rank (its embedding rows, its head rows)."""
    table = Embedding(vocab, dim, rng=np.random.default_rng(seed), dtype=np.float64)
    emb = VocabParallelEmbedding(comm, table)
    full_head = Linear(dim, vocab, rng=np.random.default_rng(seed + 1), dtype=np.float64)
    head = ColumnParallelLinear(comm, full_head, gather_output=False)
    loss_fn = VocabParallelCrossEntropy(comm, vocab)
    params = [emb.weight, *head.parameters()]
    optimizer = AdamW(params, lr=0.05, weight_decay=0.1)
    losses = []
    for step in range(steps):
        tokens, target = batches[step]
        optimizer.zero_grad()
        losses.append(loss_fn.forward(head.forward(emb.forward(tokens)), target))
        emb.backward(head.backward(loss_fn.backward()))
        optimizer.step()
    return losses, [p.data for p in params]


@pytest.mark.parametrize("t", [1, 2, 4])
def test_vocab_parallel_language_model_trains_like_one_process(t):
    vocab, dim, seed, steps = 11, 4, 7, 4                   # 11 ids: an uneven split for t = 2, 4
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, vocab, (2, 5)), rng.integers(0, vocab, (2, 5))) for _ in range(steps)]
    emb = Embedding(vocab, dim, rng=np.random.default_rng(seed), dtype=np.float64)
    head = Linear(dim, vocab, rng=np.random.default_rng(seed + 1), dtype=np.float64)
    loss_fn, optimizer = CrossEntropyLoss(), AdamW([emb.weight, *head.parameters()], lr=0.05,
                                                   weight_decay=0.1)
    losses = []
    for tokens, target in batches:
        optimizer.zero_grad()
        losses.append(loss_fn.forward(head.forward(emb.forward(tokens)), target))
        emb.backward(head.backward(loss_fn.backward()))
        optimizer.step()
    for rank, (got_losses, (w_emb, w_head, b_head)) in enumerate(
            run(_language_model, t, vocab, dim, seed, batches, steps)):
        rows = feature_slice(vocab, t, rank)
        np.testing.assert_allclose(got_losses, losses, rtol=1e-12)
        for got, want in ((w_emb, emb.weight.data[rows]), (w_head, head.weight.data[rows]),
                          (b_head, head.bias.data[rows])):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_bad_input_is_refused():
    def too_few_ids(comm):
        VocabParallelCrossEntropy(comm, 2)
    with pytest.raises(ClusterError, match="at least one"):
        run(too_few_ids, 3)

    class OneRank:
        rank, world_size = 0, 1
    loss_fn = VocabParallelCrossEntropy(OneRank(), 4)
    with pytest.raises(ValueError, match="token ids must lie"):
        loss_fn.forward(np.zeros((2, 4)), np.array([0, 4]))
    with pytest.raises(ValueError, match=r"expects logits \(\.\.\., 4\)"):
        loss_fn.forward(np.zeros((2, 3)), np.array([0, 1]))
    with pytest.raises(RuntimeError, match="before forward"):
        loss_fn.backward()
