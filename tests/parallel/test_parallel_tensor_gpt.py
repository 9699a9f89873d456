"""A whole GPT split over t = 1, 2, 4 ranks (vocabulary-parallel embedding, head and loss; heads and hidden
units split; optionally sequence parallel; tied or untied head) trains like nn.GPT in one process.

Several AdamW steps on next-token prediction; every rank's parameter shard equals the matching slice of
the single-process parameter (float64, relative 1e-9), and every step's loss is the same.
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.collectives import sum_partial_gradients
from minidist.nn import GPT, CrossEntropyLoss
from minidist.optim import AdamW
from minidist.parallel.tensor import (
    VocabParallelCrossEntropy,
    feature_slice,
    tensor_parallel,
)

V, BLOCK, LAYERS, D, HEADS, B, T, STEPS = 13, 8, 2, 12, 4, 2, 8, 3


def _gpt(tie):
    return GPT(V, BLOCK, LAYERS, D, HEADS, tie_weights=tie, rng=np.random.default_rng(0), dtype=np.float64)


def _batches():
    rng = np.random.default_rng(1)
    return [rng.integers(0, V, (B, T + 1)) for _ in range(STEPS)]


def _on_ranks(comm, tie, sequence_parallel, batches):
    model = tensor_parallel(_gpt(tie), comm, sequence_parallel=sequence_parallel)
    loss_fn = VocabParallelCrossEntropy(comm, V)
    optimizer = AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    losses = []
    for tokens in batches:
        optimizer.zero_grad()
        losses.append(loss_fn.forward(model.forward(tokens[:, :-1]), tokens[:, 1:]))
        model.backward(loss_fn.backward())
        sum_partial_gradients(model.parameters())      # sequence parallel: the token-wise parameters
        optimizer.step()
    return losses, {name: p.data for name, p in model.named_parameters()}


def _expected(gpt, t, rank):
    """The single-process parameters cut as rank's tensor_parallel GPT names and holds them."""
    vocab = feature_slice(V, t, rank)
    out = {"tok_emb.weight": gpt.tok_emb.weight.data[vocab], "pos_emb.weight": gpt.pos_emb.weight.data,
           "ln_f.weight": gpt.ln_f.weight.data, "ln_f.bias": gpt.ln_f.bias.data}
    if not gpt.tie_weights:
        out["head.weight"] = gpt.head.weight.data[vocab]
    for i, block in enumerate(gpt.blocks):
        attn, (up, _, down) = block.attn, list(block.mlp)
        heads = feature_slice(HEADS, t, rank)
        cols = np.arange(heads.start * attn.d_head, heads.stop * attn.d_head)
        hidden = feature_slice(up.out_features, t, rank)
        out.update({f"blocks.{i}.{name}": value for name, value in {
            "ln1.weight": block.ln1.weight.data, "ln1.bias": block.ln1.bias.data,
            "attn.bias": attn.proj.bias.data,
            "attn.qkv.weight": attn.qkv.weight.data[np.r_[cols, D + cols, 2 * D + cols]],
            "attn.qkv.bias": attn.qkv.bias.data[np.r_[cols, D + cols, 2 * D + cols]],
            "attn.proj.weight": attn.proj.weight.data[:, cols], "ln2.weight": block.ln2.weight.data,
            "ln2.bias": block.ln2.bias.data, "mlp.down.bias": down.bias.data,
            "mlp.up.weight": up.weight.data[hidden],
            "mlp.up.bias": up.bias.data[hidden], "mlp.down.weight": down.weight.data[:, hidden]}.items()})
    return out


@pytest.mark.parametrize("t,tie,sequence_parallel", [
    (1, False, False), (2, False, False), (4, False, False), (2, True, False),
    (2, False, True), (4, True, True)])
def test_tensor_parallel_gpt_trains_like_one_process(t, tie, sequence_parallel):
    batches = _batches()
    gpt, loss_fn = _gpt(tie), CrossEntropyLoss()
    optimizer = AdamW(gpt.parameters(), lr=0.01, weight_decay=0.1)
    losses = []
    for tokens in batches:
        optimizer.zero_grad()
        losses.append(loss_fn.forward(gpt.forward(tokens[:, :-1]), tokens[:, 1:]))
        gpt.backward(loss_fn.backward())
        optimizer.step()
    for rank, (got_losses, params) in enumerate(run(_on_ranks, t, tie, sequence_parallel, batches)):
        np.testing.assert_allclose(got_losses, losses, rtol=1e-12)
        expected = _expected(gpt, t, rank)
        assert sorted(params) == sorted(expected)
        for name, value in expected.items():
            # The key bias's gradient is 0 in exact arithmetic (a row's softmax ignores a constant added to
            # all its scores), so AdamW moves it by rounding noise / eps: compare at 1e-9 of the parameter's
            # own scale rather than element by element.
            scale = 1e-9 * np.abs(value).max()
            np.testing.assert_allclose(params[name], value, rtol=1e-9, atol=scale, err_msg=name)
