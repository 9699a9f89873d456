"""The three transforms split the one nn model in place and train exactly like it: after 3 AdamW steps
every parameter on every rank equals the matching piece of the one-process model's (float64, relative
1e-9). tensor (t = 2), tensor + sequence (t = 2), context (c = 2, zigzag and naive), expert (e = 2) on a
Switch Transformer, and the compositions tensor∘context, context∘tensor + sequence, expert∘tensor and
tensor∘expert. Each rank's loss is its share of the global mean; the replicated gradients are completed
by one sum over ``partial_over`` after backward (by hand, or by the step runner's GradientSync).
"""

from __future__ import annotations

import numpy as np
import pytest

from minidist.cluster import ClusterError, run
from minidist.collectives import sum_partial_gradients
from minidist.nn import GPT, CrossEntropyLoss, SwitchTransformer
from minidist.nn.runner import StepRunner
from minidist.optim import AdamW
from minidist.parallel.context import context_parallel, positions
from minidist.parallel.data import GradientSync, ShardWeightedLoss
from minidist.parallel.expert import expert_parallel
from minidist.parallel.tensor import (
    VocabParallelCrossEntropy,
    feature_slice,
    tensor_parallel,
)

V, BLOCK, LAYERS, D, HEADS, B, T, STEPS, EXPERTS = 11, 8, 2, 8, 2, 2, 8, 3, 4


def _model(switch: bool, groups: int = 1):
    rng = np.random.default_rng(0)
    if switch:
        return SwitchTransformer(V, BLOCK, LAYERS, D, HEADS, EXPERTS, d_ff=12, capacity_factor=2.0,
                                 aux_loss_coef=0.01, z_loss_coef=0.001, groups=groups, rng=rng,
                                 dtype=np.float64)
    return GPT(V, BLOCK, LAYERS, D, HEADS, rng=rng, dtype=np.float64)


def _batches(rows: int):
    rng = np.random.default_rng(1)
    return [rng.integers(0, V, (rows, T + 1)) for _ in range(STEPS)]


def _one_process(switch: bool, e: int):
    model, loss_fn = _model(switch, groups=e), CrossEntropyLoss()
    optimizer = AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    for tokens in _batches(B * e):
        optimizer.zero_grad()
        loss_fn.forward(model.forward(tokens[:, :-1]), tokens[:, 1:])
        model.backward(loss_fn.backward())
        optimizer.step()
    return {name: p.data for name, p in model.named_parameters()}


def _on_ranks(comm, order, t, c, e, sequence_parallel, layout, runner):
    """Ranks (expert, context, tensor), tensor innermost; the transforms applied in ``order``; runner: train
    through StepRunner with GradientSync (else forward, backward and sum_partial_gradients by hand)."""
    ti, ci, ei = comm.rank % t, comm.rank // t % c, comm.rank // (t * c)
    groups = {"tensor": comm.split(ei * c + ci, key=ti), "context": comm.split(ei * t + ti, key=ci),
              "expert": comm.split(ci * t + ti, key=ei)}
    model = _model(switch=e > 1)
    for name in order:
        if name == "tensor":
            tensor_parallel(model, groups["tensor"], sequence_parallel=sequence_parallel)
        elif name == "context":
            context_parallel(model, groups["context"], layout=layout)
        else:
            expert_parallel(model, groups["expert"])
            for block in model.blocks:          # this rank's router losses: its share 1/e of the mean
                block.mlp.aux_loss_coef /= e
                block.mlp.z_loss_coef /= e
    loss_fn = VocabParallelCrossEntropy(groups["tensor"], V) if "tensor" in order else CrossEntropyLoss()
    optimizer = AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    mine = positions(T, c, ci, layout)                       # this rank's positions of the sequence
    share = len(mine) / T / e                                # its part of the global mean loss
    step = StepRunner(model, ShardWeightedLoss(loss_fn, share), [GradientSync(model)]) if runner else None
    for tokens in _batches(B * e):
        rows = tokens[ei * B:(ei + 1) * B]
        optimizer.zero_grad()
        if step is not None:
            step.forward_backward(rows[:, mine], rows[:, mine + 1])
        else:
            loss_fn.forward(model.forward(rows[:, mine]), rows[:, mine + 1])
            model.backward(loss_fn.backward() * share)
            sum_partial_gradients(model.parameters())
        optimizer.step()
    held = {name: p.data for name, p in model.named_parameters()}
    first = [getattr(block.mlp, "first_expert", 0) for block in model.blocks]
    return held, ti, first


def _cut(full: dict, name: str, t: int, ti: int, first: list[int]) -> np.ndarray:
    """The piece of the one-process parameter that rank (tensor index ti of t) holds under ``name``."""
    parts = name.split(".")
    if parts[0] == "blocks" and parts[2] == "mlp" and parts[3] == "experts":   # a (split) expert
        layer, j = int(parts[1]), int(parts[4])
        base = f"blocks.{layer}.mlp.experts.{first[layer] + j}.layers."
        if parts[5] == "layers":
            return full[base + ".".join(parts[6:])]
        whole = full[base + ("0." if parts[5] == "up" else "2.") + parts[6]]
        hidden = feature_slice(full[base + "0.weight"].shape[0], t, ti)
        if parts[5] == "up":
            return whole[hidden]
        return whole[:, hidden] if parts[6] == "weight" else whole
    if t == 1:
        return full[name]
    if name in ("tok_emb.weight", "head.weight"):
        return full[name][feature_slice(V, t, ti)]
    if parts[0] == "blocks" and parts[2] == "attn":
        prefix = ".".join(parts[:3])
        heads = feature_slice(HEADS, t, ti)
        cols = np.arange(heads.start * D // HEADS, heads.stop * D // HEADS)
        rows = np.r_[cols, D + cols, 2 * D + cols]
        return {"qkv.weight": full[prefix + ".qkv.weight"][rows],
                "qkv.bias": full[prefix + ".qkv.bias"][rows],
                "proj.weight": full[prefix + ".proj.weight"][:, cols],
                "bias": full[prefix + ".proj.bias"]}[".".join(parts[3:])]
    if parts[0] == "blocks" and parts[2] == "mlp" and parts[3] in ("up", "down"):
        prefix = ".".join(parts[:3])
        hidden = feature_slice(full[prefix + ".layers.0.weight"].shape[0], t, ti)
        return {"up.weight": full[prefix + ".layers.0.weight"][hidden],
                "up.bias": full[prefix + ".layers.0.bias"][hidden],
                "down.weight": full[prefix + ".layers.2.weight"][:, hidden],
                "down.bias": full[prefix + ".layers.2.bias"]}[".".join(parts[3:])]
    return full[name]


@pytest.mark.parametrize("order,t,c,e,sequence_parallel,layout,runner", [
    (("tensor",), 2, 1, 1, False, "zigzag", False),
    (("tensor",), 2, 1, 1, True, "zigzag", True),
    (("context",), 1, 2, 1, False, "zigzag", True),
    (("context",), 1, 2, 1, False, "naive", False),
    (("expert",), 1, 1, 2, False, "zigzag", True),
    (("tensor", "context"), 2, 2, 1, False, "zigzag", False),
    (("context", "tensor"), 2, 2, 1, True, "zigzag", True),
    (("expert", "tensor"), 2, 1, 2, False, "zigzag", False),
    (("tensor", "expert"), 2, 1, 2, False, "zigzag", True),
])
def test_transformed_model_trains_like_the_one_process_model(order, t, c, e, sequence_parallel, layout,
                                                              runner):
    full = _one_process(switch=e > 1, e=e)
    for held, ti, first in run(_on_ranks, t * c * e, order, t, c, e, sequence_parallel, layout, runner,
                               timeout=300):
        # every parameter is held once, in pieces; the experts of the other expert ranks are not
        assert len(held) == len(full) - LAYERS * (EXPERTS - EXPERTS // e) * 4
        for name, value in held.items():
            want = _cut(full, name, t, ti, first)
            # a key bias's gradient is 0 in exact arithmetic, so AdamW moves it by rounding noise / eps
            np.testing.assert_allclose(value, want, rtol=1e-9, atol=1e-9 * np.abs(want).max(), err_msg=name)


def test_transforms_refuse_what_they_cannot_split():
    gpt = _model(switch=False)
    with pytest.raises(ValueError, match="MoE"):
        expert_parallel(gpt, None)                      # refused before the group is used
    with pytest.raises(TypeError, match="nn.GPT"):
        tensor_parallel(gpt.blocks[0].attn, None)
    with pytest.raises(TypeError, match="nn.GPT"):
        context_parallel(gpt.ln_f, None)
    with pytest.raises(ClusterError, match="sequence parallelism with a mixture-of-experts"):
        run(lambda comm: tensor_parallel(_model(switch=True), comm, sequence_parallel=True), 2)
    with pytest.raises(ClusterError, match="dropout = 0 only"):
        run(lambda comm: context_parallel(GPT(V, BLOCK, 1, D, HEADS, dropout=0.1), comm), 2)
    with pytest.raises(ClusterError, match="layout must be one of"):
        run(lambda comm: context_parallel(_model(switch=False), comm, layout="spiral"), 2)
