"""The five-axis grid (data × pipeline × context × expert × tensor, minidist/parallel/grid_pipeline.py with
grid_expert.py) trains a tiny Switch Transformer like one process.

A float64 SwitchTransformer (vocabulary 11, 8 positions, 2 blocks, d = 8, 2 heads, 2 experts of d_ff 16,
top-1) pipelined as its units, trained 3 AdamW steps; every parameter (shard) each rank holds and each
step's loss must equal one process's. Without context the grid routes each (token set, micro-batch) as one
group with capacity factor 1 (tokens are dropped) and the balance and z-losses on: one process routes the
same S·M contiguous groups (MoE groups=S·M). With context a group is a rank's zigzag positions, which no
contiguous grouping matches: capacity factor E (nothing dropped) and the z-loss only (a mean over tokens).
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import CrossEntropyLoss, SwitchTransformer
from minidist.optim import AdamW
from minidist.parallel.expert import AverageGradients
from minidist.parallel.grid_expert import switch_units
from minidist.parallel.grid_pipeline import DataPipelineGrid, gpt_units
from minidist.parallel.pipeline.chimera import chimera_schedule
from minidist.parallel.pipeline.interleaved import interleaved_schedule
from minidist.parallel.pipeline.schedule import one_f_one_b_schedule
from minidist.parallel.pipeline.tasks import from_ops
from minidist.parallel.pipeline.zero_bubble import zero_bubble_schedule
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
        losses.append(loss_fn.forward(model.forward(x), y))
        model.backward(loss_fn.backward())
        opt.step()
    return model, losses


def expected_unit(unit, t, q, j, e):
    """A reference unit's parameters cut as tensor rank q of t, expert rank j of e hold them, in the order of
    the grid's unit (TensorExpertBlock: ln1, attention, ln2, router, this rank's experts)."""
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


def _train(comm, layout, schedule, stages, micro_batches, zero1):
    data, tensor, context, expert, experts = layout
    model, (x, y) = build(experts, context=context > 1), batch()
    grid = DataPipelineGrid(comm, lambda tc, cc, ec: switch_units(tc, cc, ec, model, T),
                            loss_fn=CrossEntropyLoss(), schedule=schedule, num_stages=stages,
                            num_micro_batches=micro_batches, data=data, tensor=tensor, context=context,
                            expert=expert, seq_len=T, zero1=zero1)
    opt = grid.build_optimizer(lambda params: AdamW(params, lr=0.01))
    losses = [grid.train_step(x, y, opt) for _ in range(STEPS)]
    mine = {id(p) for p in grid.parameters()}
    held = {i: [p.data for p in unit.parameters()] for i, unit in enumerate(grid.model.layers)
            if id(unit.parameters()[0]) in mine}
    stepped = sum(p.size for p in (grid.zero.optimizer.params if zero1 else grid.parameters()))
    return held, losses, grid.tensor_rank, grid.expert_rank, stepped


# layout (data, tensor, context, expert, number of experts), schedule, stages, micro-batches, zero1; the
# tables are built when a case runs (a student copy may have cut a schedule's exercise)
def one_stage():
    return from_ops(one_f_one_b_schedule(1, 2))


def one_f_one_b():
    return from_ops(one_f_one_b_schedule(2, 2))


def zb_h1():
    return zero_bubble_schedule(2, 2)


CASES = {
    "8: expert 2 x data 2 x pipeline 2 (1F1B)": ((2, 1, 1, 2, 2), one_f_one_b, 2, 2, 0),
    "8: expert 2 x data 2 x pipeline 2, ZeRO-1": ((2, 1, 1, 2, 2), one_f_one_b, 2, 2, 1),
    "8: expert 2 x tensor 2 x data 2, ZeRO-1": ((2, 2, 1, 2, 2), one_stage, 1, 2, 1),
    "8: expert 2 x context 2 x pipeline 2 (ZB-H1)": ((1, 1, 2, 2, 2), zb_h1, 2, 2, 0),
    "8: expert 2 x tensor 2 x context 2": ((1, 2, 2, 2, 2), one_stage, 1, 2, 0),
    "8: expert 2 x pipeline 4 (Chimera)": ((1, 1, 1, 2, 2), lambda: chimera_schedule(4, 4), 4, 4, 0),
    "4: expert 2 x interleaved pipeline 2": ((1, 1, 1, 2, 2), lambda: interleaved_schedule(2, 2, 2), 4, 2, 0),
    "4: expert 4 (4 experts)": ((1, 1, 1, 4, 4), one_stage, 1, 2, 0),
    "4: expert 2 x tensor 2": ((1, 2, 1, 2, 2), one_stage, 1, 2, 0),
    "4: expert 2 x pipeline 2 (ZB-H1)": ((1, 1, 1, 2, 2), zb_h1, 2, 2, 0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_parallel_grid_with_an_expert_axis_trains_a_switch_transformer_like_one_process(name):
    layout, make_schedule, stages, micro_batches, zero1 = CASES[name]
    schedule = make_schedule()
    data, tensor, context, expert, experts = layout
    groups = 1 if context > 1 else data * expert * micro_batches
    model, expected_losses = reference(experts, groups, context > 1)
    units = gpt_units(model).layers
    pipe = 1 + max(t.rank for tick in schedule for t in tick)
    results = run(_train, data * tensor * context * expert * pipe, layout, schedule, stages, micro_batches,
                  zero1, timeout=120)
    seen = set()
    held_elements = sum(p.size for held, *_ in results for values in held.values() for p in values)
    assert sum(stepped for *_, stepped in results) == held_elements // (data if zero1 else 1)
    for held, _, q, j, _ in results:
        for i, values in held.items():
            want = expected_unit(units[i], tensor, q, j, expert)
            assert len(values) == len(want)
            for got, value in zip(values, want, strict=True):
                np.testing.assert_allclose(got, value, rtol=1e-9, atol=1e-11)
            seen.add(i)
    assert seen == set(range(len(units)))
    for step in range(STEPS):      # tensor ranks of the last stage report the same share: count one (q = 0)
        total = sum(losses[step] for _, losses, q, *_ in results if losses[step] is not None and q == 0)
        assert total == pytest.approx(expected_losses[step], rel=1e-10)


def _bad(comm, case):
    model = build(3 if case == "experts" else 2)
    layout = dict(data=1, expert=3) if case == "axis" else dict(data=1, expert=2)
    grid = DataPipelineGrid(comm, lambda tc, cc, ec: switch_units(tc, cc, ec, model),
                            loss_fn=CrossEntropyLoss(), schedule=one_stage(), num_stages=1,
                            num_micro_batches=2, zero1=case == "zero1", **layout)
    x, y = batch()
    if case == "batch":
        grid.train_step(x[:3], y[:3], AdamW(grid.parameters()))
    grid.train_step(x, y, AdamW(grid.parameters()))


@pytest.mark.parametrize("case,message", [
    ("axis", "expert = 3 must be an integer >= 1 dividing world_size 2"),
    ("experts", "3 experts cannot be spread evenly over 2 ranks"),
    ("batch", r"a batch of 3 samples .* does not split into D·e = 2 equal token sets"),
    ("zero1", "with zero1 the optimizer must be build_optimizer's"),
])
def test_parallel_grid_with_an_expert_axis_refuses_bad_input(case, message):
    with pytest.raises(Exception, match=message):
        run(_bad, 2, case)


def test_parallel_average_gradients_attachment_refuses_token_sets_that_do_not_divide():
    class FourRanks:
        rank, world_size = 0, 4

    with pytest.raises(ValueError, match="token_sets must divide the world size 4, got 3"):
        AverageGradients(FourRanks(), build(), token_sets=3)
