"""Context-parallel transformer blocks and GPTs (ring attention inside) on c = 1, 2, 4 ranks train like one
process.

Two nn.TransformerBlocks, AdamW for several steps, the sequence split naive or zigzag (even and uneven
T): every parameter on every rank equals the single-process parameter (float64, relative 1e-9), and the
bytes each rank sends equal the ring's traffic plus one all-reduce of the blocks' gradients.
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.collectives import sum_partial_gradients
from minidist.nn import GPT, CrossEntropyLoss, TransformerBlock
from minidist.optim import AdamW
from minidist.parallel.context import context_parallel, positions, ring_traffic, shard

B, D, HEADS, STEPS = 2, 8, 2, 3


def _blocks():
    rng = np.random.default_rng(0)
    return [TransformerBlock(D, HEADS, rng=rng, dtype=np.float64) for _ in range(2)]


def _train(blocks, batches, cut=lambda a: a):
    optimizer = AdamW([p for b in blocks for p in b.parameters()], lr=0.01, weight_decay=0.1)
    for x, target in batches:
        optimizer.zero_grad()
        y = cut(x)
        for block in blocks:
            y = block.forward(y)
        dy = 2 * (y - cut(target)) / target.size
        for block in reversed(blocks):
            dy = block.backward(dy)
        sum_partial_gradients([p for b in blocks for p in b.parameters()])   # over the context group
        optimizer.step()
    return [p.data for b in blocks for p in b.parameters()]


def _on_ranks(comm, seq_len, layout, batches):
    blocks = [context_parallel(b, comm, seq_len=seq_len, layout=layout) for b in _blocks()]
    params = _train(blocks, batches, lambda a: shard(a, comm.world_size, comm.rank, layout, axis=1))
    return params, comm.stats.bytes_sent


@pytest.mark.parametrize("c,seq_len,layout", [
    (1, 8, "zigzag"), (2, 8, "naive"), (2, 8, "zigzag"), (4, 8, "zigzag"), (4, 8, "naive"),
    (2, 11, "zigzag"), (4, 10, "naive")])                      # uneven splits
def test_context_parallel_blocks_train_like_one_process(c, seq_len, layout):
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((B, seq_len, D)), rng.standard_normal((B, seq_len, D)))
               for _ in range(STEPS)]
    expected = _train(_blocks(), batches)
    psi = sum(p.data.size for p in _blocks()[0].parameters())
    for rank, (params, sent) in enumerate(run(_on_ranks, c, seq_len, layout, batches)):
        for got, want in zip(params, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
        ring = ring_traffic(seq_len, c, rank, B, HEADS, D // HEADS, 8, layout)
        allreduce = 2 * (c - 1) * psi // c * 8 if psi % c == 0 else None
        if allreduce is not None:
            assert sent == STEPS * 2 * (ring["forward_bytes"] + ring["backward_bytes"] + allreduce)


V, LAYERS = 11, 2


def _gpt(tie):
    return GPT(V, 12, LAYERS, D, HEADS, tie_weights=tie, rng=np.random.default_rng(0), dtype=np.float64)


def _gpt_on_ranks(comm, seq_len, layout, tie, batches):
    model = context_parallel(_gpt(tie), comm, seq_len=seq_len, layout=layout)
    optimizer, loss_fn = AdamW(model.parameters(), lr=0.01, weight_decay=0.1), CrossEntropyLoss()
    mine = positions(seq_len, comm.world_size, comm.rank, layout)    # this rank's tokens
    shares = []
    for tokens in batches:
        optimizer.zero_grad()
        local_mean = loss_fn.forward(model.forward(tokens[:, mine]), tokens[:, mine + 1])
        share = len(mine) / seq_len                        # this rank's part of the mean over all tokens
        shares.append(local_mean * share)
        model.backward(loss_fn.backward() * share)
        sum_partial_gradients(model.parameters())          # every parameter saw this rank's tokens only
        optimizer.step()
    return shares, {name: p.data for name, p in model.named_parameters()}


@pytest.mark.parametrize("c,seq_len,layout,tie", [
    (1, 8, "zigzag", False), (2, 8, "zigzag", False), (4, 8, "zigzag", True), (2, 9, "naive", True),
    (4, 10, "naive", False)])
def test_context_parallel_gpt_trains_like_one_process(c, seq_len, layout, tie):
    rng = np.random.default_rng(2)
    batches = [rng.integers(0, V, (B, seq_len + 1)) for _ in range(STEPS)]
    gpt, loss_fn = _gpt(tie), CrossEntropyLoss()
    optimizer, losses = AdamW(gpt.parameters(), lr=0.01, weight_decay=0.1), []
    for tokens in batches:
        optimizer.zero_grad()
        losses.append(loss_fn.forward(gpt.forward(tokens[:, :-1]), tokens[:, 1:]))
        gpt.backward(loss_fn.backward())
        optimizer.step()
    expected = dict(gpt.named_parameters())
    results = run(_gpt_on_ranks, c, seq_len, layout, tie, batches)
    np.testing.assert_allclose(np.sum([r[0] for r in results], axis=0), losses, rtol=1e-12)
    for _, params in results:
        assert sorted(params) == sorted(expected)
        for name, p in expected.items():
            # a key bias's gradient is 0 in exact arithmetic, so AdamW moves it by rounding noise / eps:
            # compare at 1e-9 of each parameter's own scale
            np.testing.assert_allclose(params[name], p.data, rtol=1e-9, atol=1e-9 * np.abs(p.data).max(),
                                       err_msg=name)
