"""Context-parallel transformer blocks (ring attention inside) on c = 1, 2, 4 ranks train like one process.

Two nn.TransformerBlocks, AdamW for several steps, the sequence split naive or zigzag (even and uneven
T): every parameter on every rank equals the single-process parameter (float64, relative 1e-9), and the
bytes each rank sends equal the ring's traffic plus one all-reduce of the block's gradients.
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import TransformerBlock
from minidist.optim import AdamW
from minidist.parallel.context import ContextParallelBlock, ring_traffic, shard

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
        optimizer.step()
    return [p.data for b in blocks for p in b.parameters()]


def _on_ranks(comm, seq_len, layout, batches):
    blocks = [ContextParallelBlock(comm, b, seq_len, layout=layout) for b in _blocks()]
    params = _train(blocks, batches, lambda a: shard(a, comm.world_size, comm.rank, layout, axis=1))
    return params, comm.stats.bytes_sent


@pytest.mark.parametrize("c,seq_len,layout", [
    (1, 8, "zigzag"), (2, 8, "naive"), (2, 8, "zigzag"), (4, 8, "zigzag"), (4, 8, "naive"),
    (2, 11, "zigzag"), (4, 10, "naive")])                      # uneven splits
def test_context_parallel_blocks_train_like_one_process(c, seq_len, layout):
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((B, seq_len, D)), rng.standard_normal((B, seq_len, D))) for _ in range(STEPS)]
    expected = _train(_blocks(), batches)
    psi = sum(p.data.size for p in _blocks()[0].parameters())
    for rank, (params, sent) in enumerate(run(_on_ranks, c, seq_len, layout, batches)):
        for got, want in zip(params, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
        ring = ring_traffic(seq_len, c, rank, B, HEADS, D // HEADS, 8, layout)
        allreduce = 2 * (c - 1) * psi // c * 8 if psi % c == 0 else None
        if allreduce is not None:
            assert sent == STEPS * 2 * (ring["forward_bytes"] + ring["backward_bytes"] + allreduce)
