"""Tensor-parallel transformer blocks (heads and hidden units split; optionally sequence parallel) on
t = 1, 2, 4 ranks, and on t × c grids with the sequence also split by ring attention, against
nn.TransformerBlock in one process.

Two blocks trained with AdamW for several steps end with every parameter shard equal to the matching
slice of the single-process parameters (float64, relative 1e-9); bytes per rank equal the formulas of
transform.py and the partial-gradient sum; the activation memory of the LayerNorm regions falls by t with
sequence parallelism.
"""

import copy

import numpy as np
import pytest

from minidist.cluster import ClusterError, run
from minidist.collectives import sum_partial_gradients
from minidist.nn import TransformerBlock
from minidist.optim import AdamW
from minidist.parallel.context import context_parallel, positions, ring_traffic, shard
from minidist.parallel.tensor import (
    block_activation_bytes,
    block_bytes_sent,
    block_comm_seconds,
    feature_slice,
    sequence_shard,
    tensor_parallel,
)
from minidist.sim.memory import held_bytes

B, T, D, STEPS = 2, 8, 12, 3


def _blocks(heads, seed=0):
    rng = np.random.default_rng(seed)
    return [TransformerBlock(D, heads, rng=rng, dtype=np.float64) for _ in range(2)]


def _batches():
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((B, T, D)), rng.standard_normal((B, T, D))) for _ in range(STEPS)]


def _train(blocks, params, batches, cut=lambda a: a):
    """MSE of the last block's output against a target; AdamW. cut: this rank's tokens (identity if whole)."""
    optimizer = AdamW(params, lr=0.01, weight_decay=0.1)
    for x, target in batches:
        optimizer.zero_grad()
        y = cut(x)
        for block in blocks:
            y = block.forward(y)
        dy = 2 * (y - cut(target)) / target.size          # d mean((y − target)²) / dy, this rank's tokens
        for block in reversed(blocks):
            dy = block.backward(dy)
        sum_partial_gradients(params)                     # gradients summed over this rank's tokens only
        optimizer.step()


def _on_ranks(comm, heads, sequence_parallel, batches):
    blocks = [tensor_parallel(b, comm, sequence_parallel=sequence_parallel) for b in _blocks(heads)]
    params = [p for b in blocks for p in b.parameters()]
    cut = (lambda a: sequence_shard(a, comm.world_size, comm.rank)) if sequence_parallel else (lambda a: a)
    before = comm.stats.bytes_sent
    _train(blocks, params, batches, cut)
    return [p.data for p in params], comm.stats.bytes_sent - before


def _expected_shards(block, t, rank):
    """The single-process block's parameters cut as rank's tensor_parallel block holds them, in its order."""
    attn, (up, _, down) = block.attn, list(block.mlp)
    heads = feature_slice(attn.n_heads, t, rank)
    cols = np.arange(heads.start * attn.d_head, heads.stop * attn.d_head)
    rows = np.concatenate([cols, D + cols, 2 * D + cols])
    hidden = feature_slice(up.out_features, t, rank)
    # a module's own Parameters come before its children's
    return [block.ln1.weight.data, block.ln1.bias.data,
            attn.proj.bias.data, attn.qkv.weight.data[rows], attn.qkv.bias.data[rows],
            attn.proj.weight.data[:, cols], block.ln2.weight.data, block.ln2.bias.data,
            up.weight.data[hidden], up.bias.data[hidden], down.weight.data[:, hidden], down.bias.data]


@pytest.mark.parametrize("t,heads,sequence_parallel", [
    (1, 4, False), (2, 4, False), (4, 4, False), (2, 3, False),      # 3 heads on 2 ranks: an uneven split
    (1, 4, True), (2, 4, True), (4, 4, True), (2, 3, True)])
def test_tensor_parallel_blocks_train_like_one_process(t, heads, sequence_parallel):
    batches = _batches()
    reference = _blocks(heads)
    _train(reference, [p for b in reference for p in b.parameters()], batches)
    results = run(_on_ranks, t, heads, sequence_parallel, batches)
    for rank, (params, sent) in enumerate(results):
        expected = [a for b in reference for a in _expected_shards(b, t, rank)]
        assert len(params) == len(expected)
        for got, want in zip(params, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
        assert sent == STEPS * 2 * block_bytes_sent(B, T, D, t, 8, sequence_parallel)   # 2 blocks, float64


def test_sequence_parallel_needs_t_to_divide_the_sequence():
    def uneven(comm):
        block = tensor_parallel(_blocks(4)[0], comm, sequence_parallel=True)
        block.forward(np.zeros((1, 3, D)))                      # 3 tokens here, 6 in all: fine
        sequence_shard(np.zeros((1, 7, D)), 2, comm.rank)
    with pytest.raises(ClusterError, match="divisible by 2"):
        run(uneven, 2)
    with pytest.raises(ClusterError, match="at least one head"):
        run(lambda comm: tensor_parallel(_blocks(2)[0], comm), 4)


def _activations(comm, heads, sequence_parallel):
    block = tensor_parallel(_blocks(heads)[0], comm, sequence_parallel=sequence_parallel)
    x = np.random.default_rng(2).standard_normal((B, T, D))
    block.forward(sequence_shard(x, comm.world_size, comm.rank) if sequence_parallel else x)
    parts = {"layernorm": [block.ln1, block.ln2], "attention": [block.attn], "mlp": [block.mlp]}
    measured = {k: sum(held_bytes(model=m)["activations"] for m in ms) for k, ms in parts.items()}
    return measured, held_bytes(model=block)["activations"]


@pytest.mark.parametrize("t,heads", [(1, 4), (2, 4), (4, 4), (2, 3)])
def test_activation_bytes_equal_the_formula_and_sequence_parallelism_divides_the_layernorm_regions(t, heads):
    d_ff = 4 * D
    for sequence_parallel in (False, True):
        for rank, (measured, total) in enumerate(run(_activations, t, heads, sequence_parallel)):
            formula = block_activation_bytes(B, T, D, heads, d_ff, t, rank, 8, sequence_parallel)
            assert measured == {k: formula[k] for k in measured}
            assert total == formula["total"]
    tp = block_activation_bytes(B, T, D, heads, d_ff, t, 0, 8, False)
    sp = block_activation_bytes(B, T, D, heads, d_ff, t, 0, 8, True)
    assert sp["layernorm"] * t == tp["layernorm"]
    assert (sp["attention"], sp["mlp"]) == (tp["attention"], tp["mlp"])


def _clock_of_one_step(comm):
    block = tensor_parallel(_blocks(4)[0], comm)
    x = np.random.default_rng(3).standard_normal((B, T, D))
    start = comm.clock
    block.backward(np.ones_like(block.forward(x)))
    return comm.clock - start


@pytest.mark.parametrize("t", [1, 2, 4])
def test_the_block_clock_equals_the_closed_form(t):
    for seconds in run(_clock_of_one_step, t):
        assert seconds == pytest.approx(block_comm_seconds(B, T, D, t, 8), rel=1e-12, abs=1e-15)


def _grid(comm, t, heads, sequence_parallel, layout, batches):
    """t × c ranks: rank = ci·t + ti; tensor groups share a piece of the sequence,
    context groups the heads."""
    c, ci, ti = comm.world_size // t, comm.rank // t, comm.rank % t
    tp, cp = comm.split(ci, key=ti), comm.split(ti, key=ci)
    blocks = [tensor_parallel(context_parallel(copy.deepcopy(b), cp, layout=layout, seq_len=T), tp,
                              sequence_parallel=sequence_parallel)
              for b in _blocks(heads)]
    params = [p for b in blocks for p in b.parameters()]

    def cut(a):
        mine = shard(a, c, ci, layout, axis=1)
        return sequence_shard(mine, t, ti) if sequence_parallel else mine
    before = tp.stats.bytes_sent, cp.stats.bytes_sent
    _train(blocks, params, batches, cut)
    return [p.data for p in params], (tp.stats.bytes_sent - before[0], cp.stats.bytes_sent - before[1])


@pytest.mark.parametrize("t,c,heads,sequence_parallel,layout", [
    (2, 2, 4, False, "zigzag"), (2, 2, 4, True, "zigzag"), (2, 2, 3, False, "naive"),
    (1, 4, 4, False, "zigzag"), (4, 1, 4, True, "naive")])
def test_tensor_times_context_parallel_blocks_train_like_one_process(t, c, heads, sequence_parallel, layout):
    batches = _batches()
    reference = _blocks(heads)
    _train(reference, [p for b in reference for p in b.parameters()], batches)
    for rank, (params, (tp_sent, cp_sent)) in enumerate(run(_grid, t * c, t, heads, sequence_parallel, layout,
                                                            batches)):
        ci, ti = rank // t, rank % t
        expected = [a for b in reference for a in _expected_shards(b, t, ti)]
        for got, want in zip(params, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
        tokens = len(positions(T, c, ci, layout))
        assert tp_sent == STEPS * 2 * block_bytes_sent(B, tokens, D, t, 8, sequence_parallel)
        heads_p = len(range(heads)[feature_slice(heads, t, ti)])
        ring = ring_traffic(T, c, ci, B, heads_p, D // heads, 8, layout)
        psi_p = sum(p.size for p in params) // 2
        if psi_p % c == 0:
            grads = 2 * (c - 1) * psi_p // c * 8
            assert cp_sent == STEPS * 2 * (ring["forward_bytes"] + ring["backward_bytes"] + grads)
