"""Five-axis meshes (data × pipeline × context × expert × tensor: Mesh + parallelize, minidist/parallel/
compose/) train a tiny Switch Transformer like one process, the expert axis with every schedule.

A float64 SwitchTransformer (vocabulary 11, 8 positions, 2 blocks, d = 8, 2 heads, 2 experts of d_ff 16,
top-1) pipelined as its units, trained 3 AdamW steps; every parameter (shard) each rank holds and each
step's loss must equal one process's. Without context the mesh routes each (token set, micro-batch) as one
group with capacity factor 1 (tokens are dropped) and the balance and z-losses on: one process routes the
same S·M contiguous groups (MoE groups=S·M). With context a group is a rank's zigzag positions, which no
contiguous grouping matches: capacity factor E (nothing dropped) and the z-loss only (a mean over tokens).
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import CrossEntropyLoss, SwitchTransformer
from minidist.optim import AdamW
from minidist.parallel import Mesh, parallelize
from minidist.parallel.tensor import feature_slice

STEPS, N, T, V, D_FF = 3, 8, 8, 11, 16


def build(experts=2, groups=1, context=False) -> SwitchTransformer:
    routing = dict(capacity_factor=float(experts), aux_loss_coef=0.0) if context else \
        dict(capacity_factor=1.0, aux_loss_coef=0.01)
    return SwitchTransformer(V, T, 2, 8, 2, experts, D_FF, z_loss_coef=0.001, groups=groups, **routing,
                             rng=np.random.default_rng(5), dtype=np.float64)


def batch():
    rng = np.random.default_rng(9)
    return rng.integers(0, V, size=(N, T)), rng.integers(0, V, size=(N, T))


def reference(experts, groups, context):
    """One process: the whole batch, S·M routing groups; its units' parameters and losses after each step."""
    model, (x, y) = build(experts, groups, context), batch()
    loss_fn, opt, losses = CrossEntropyLoss(), AdamW(model.parameters(), lr=0.01), []
    for _ in range(STEPS):
        model.zero_grad()
        losses.append(loss_fn.forward(model.forward(x), y) + model.router_loss)    # the objective
        model.backward(loss_fn.backward())
        opt.step()
    return model, losses


def expected_unit(unit, t, q, j, e):
    """A reference unit's parameters cut as tensor rank q of t, expert rank j of e hold them, in the order of
    the split unit (TensorExpertBlock: ln1, attention, ln2, router, this rank's experts)."""
    if not hasattr(unit, "mlp"):
        return [p.data for p in unit.parameters()]
    attn, moe, d = unit.attn, unit.mlp, unit.attn.d_model
    heads = feature_slice(attn.n_heads, t, q)
    cols = np.arange(heads.start * attn.d_head, heads.stop * attn.d_head)
    rows = np.concatenate([cols, d + cols, 2 * d + cols])
    out = [unit.ln1.weight.data, unit.ln1.bias.data, attn.proj.bias.data, attn.qkv.weight.data[rows],
           attn.qkv.bias.data[rows], attn.proj.weight.data[:, cols], unit.ln2.weight.data, unit.ln2.bias.data,
           moe.router.weight.data]
    per_rank = moe.num_experts // e
    hidden = feature_slice(D_FF, t, q)
    for up, _, down in (ex.layers for ex in moe.experts[j * per_rank:(j + 1) * per_rank]):
        out += [up.weight.data[hidden], up.bias.data[hidden], down.weight.data[:, hidden], down.bias.data]
    return out


def _train(comm, layout, schedule, pipeline, micro_batches, zero):
    data, tensor, context, expert, experts = layout
    groups = 1 if context > 1 else data * expert * micro_batches
    model, (x, y) = build(experts, groups, context=context > 1), batch()
    mesh = Mesh(comm, data=data, pipeline=pipeline, context=context, expert=expert, tensor=tensor)
    trainer = parallelize(model, mesh, loss_fn=CrossEntropyLoss(), schedule=schedule, zero=zero,
                          optimizer=lambda params: AdamW(params, lr=0.01), micro_batches=micro_batches)
    losses = [trainer.train_step(x, y) for _ in range(STEPS)]
    mine = {id(p) for p in trainer.held}
    held = {i: [p.data for p in unit.parameters()] for i, unit in enumerate(trainer.units.layers)
            if id(unit.parameters()[0]) in mine}
    stepped = sum(p.size for p in trainer.optimizer.params)
    return held, losses, mesh.coords["tensor"], mesh.coords["expert"], stepped


# layout (data, tensor, context, expert, number of experts), schedule, pipeline ranks, micro-batches, zero
CASES = {
    "8: expert 2 x data 2 x pipeline 2 (1F1B)": ((2, 1, 1, 2, 2), "1f1b", 2, 2, 0),
    "8: expert 2 x data 2 x pipeline 2, ZeRO-1": ((2, 1, 1, 2, 2), "1f1b", 2, 2, 1),
    "8: expert 2 x tensor 2 x data 2, ZeRO-1": ((2, 2, 1, 2, 2), "1f1b", 1, 2, 1),
    "8: expert 2 x context 2 x pipeline 2 (ZB-H1)": ((1, 1, 2, 2, 2), "zb-h1", 2, 2, 0),
    "8: expert 2 x tensor 2 x context 2": ((1, 2, 2, 2, 2), "1f1b", 1, 2, 0),
    "8: expert 2 x pipeline 4 (Chimera)": ((1, 1, 1, 2, 2), "chimera", 4, 4, 0),
    "4: expert 2 x interleaved pipeline 2": ((1, 1, 1, 2, 2), "interleaved", 2, 2, 0),
    "4: expert 4 (4 experts)": ((1, 1, 1, 4, 4), "1f1b", 1, 2, 0),
    "4: expert 2 x tensor 2": ((1, 2, 1, 2, 2), "1f1b", 1, 2, 0),
    "4: expert 2 x pipeline 2 (ZB-H1)": ((1, 1, 1, 2, 2), "zb-h1", 2, 2, 0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_parallel_grid_with_an_expert_axis_trains_a_switch_transformer_like_one_process(name):
    layout, schedule, pipeline, micro_batches, zero = CASES[name]
    data, tensor, context, expert, experts = layout
    groups = 1 if context > 1 else data * expert * micro_batches
    model, expected_losses = reference(experts, groups, context > 1)
    units = model.units()
    results = run(_train, data * tensor * context * expert * pipeline, layout, schedule, pipeline,
                  micro_batches, zero, timeout=120)
    seen = set()
    held_elements = sum(p.size for held, *_ in results for values in held.values() for p in values)
    assert sum(stepped for *_, stepped in results) == held_elements // (data if zero else 1)
    for held, _, q, j, _ in results:
        for i, values in held.items():
            want = expected_unit(units[i], tensor, q, j, expert)
            assert len(values) == len(want)
            for got, value in zip(values, want, strict=True):
                np.testing.assert_allclose(got, value, rtol=1e-9, atol=1e-11)
            seen.add(i)
    assert seen == set(range(len(units)))
    for _, losses, *_ in results:          # the global objective (the z-loss's share too), on every rank
        np.testing.assert_allclose(losses, expected_losses, rtol=1e-10)


def _bad(comm, case):
    model = build(3 if case == "experts" else 2, groups=4)
    layout = dict(data=1, expert=3) if case == "axis" else dict(data=1, expert=2)
    trainer = parallelize(model, Mesh(comm, **layout), loss_fn=CrossEntropyLoss(), micro_batches=2,
                          optimizer=AdamW)
    x, y = batch()
    trainer.train_step(x[:3], y[:3])


@pytest.mark.parametrize("case,message", [
    ("axis", "mesh sizes .* multiply to 3, but the world size is 2"),
    ("experts", "3 experts cannot be spread evenly over expert = 2 ranks"),
    ("batch", r"a batch of 3 does not split into data × expert × micro_batches = 4 equal parts"),
])
def test_parallel_grid_with_an_expert_axis_refuses_bad_input(case, message):
    with pytest.raises(Exception, match=message):
        run(_bad, 2, case)

