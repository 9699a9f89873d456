"""The planner's minidist mode (minidist/plan/minidist_mode.py) against real runs of Mesh + parallelize.

A float64 GPT (vocabulary 11, 8 positions, 2 blocks, d = 8, 2 heads, batch 8) trained one AdamW step on
every layout that runs on ≤ 8 ranks (minidist/plan/check.py: 171 of them — data × pipeline × context ×
tensor under 1F1B, interleaved, ZB-H1 and Chimera, with every micro-batch count that divides): each rank's
simulated clock over the step must equal the predicted step time (the issue asks for 5%; it matches to
rounding, asserted at 1e-9, because the prediction walks the same table by the same rules), and the model
states the memory ledger counts (held_bytes) plus the most activation bytes the executor held after any
task (Pipeline.memory) must equal the predicted peak exactly (the issue asks for 2%). The layouts of
one world size share one run."""

from collections import Counter

import numpy as np
import pytest

from minidist.cluster import Device, LinkModel, run
from minidist.nn import GPT, Sequential
from minidist.parallel import Mesh, split_for_mesh
from minidist.parallel.pipeline.schedule import one_f_one_b_schedule
from minidist.parallel.pipeline.tasks import Task
from minidist.plan.check import GridLayout, build_gpt, measure, predict, runnable_layouts
from minidist.plan.minidist_clock import replica_sum_seconds
from minidist.plan.minidist_mode import predict_grid, predict_states, predict_step_seconds, unit_params
from minidist.plan.model import ModelSpec

from .layout_count import as_tuple, brute_force_layouts, fewest_micro_batches

SPEC = ModelSpec(layers=2, d_model=8, heads=2, seq=8, batch=8, vocab=11)
LAYOUTS = runnable_layouts(SPEC)
# a slow device and a fast link, so that compute and every kind of traffic weigh in the step
DEVICE, LINK = Device(flops=1e9), LinkModel(alpha=1e-6, beta=1 / 5e9)


def build() -> GPT:
    return build_gpt(SPEC, seed=5)


def test_plan_check_enumerates_every_axis_and_schedule():
    # the counts are derived: a brute-force enumeration of the rules (tests/plan/layout_count.py)
    expected = brute_force_layouts(SPEC.layers, SPEC.heads, SPEC.ff, SPEC.seq, SPEC.batch)
    got = [as_tuple(lay) for lay in LAYOUTS]
    assert sorted(got) == sorted(expected) and len(set(got)) == len(got)                 # 171 today
    assert max(lay.world for lay in LAYOUTS) == 8
    assert Counter(lay.schedule for lay in LAYOUTS if lay.pipe > 1) == \
        Counter(lay[5] for lay in expected if lay[1] > 1)
    assert {lay.micro_batches for lay in LAYOUTS} == {1, 2, 4, 8}                # the divisors of the batch
    fewest = runnable_layouts(SPEC, fewest_micro_batches=True)                # lesson 19's 73
    assert {as_tuple(lay) for lay in fewest} == fewest_micro_batches(expected) and \
        len(fewest) == len(fewest_micro_batches(expected))
    assert {(lay.world, lay.schedule) for lay in fewest} == {(lay.world, lay.schedule) for lay in LAYOUTS}
    assert {lay.context for lay in LAYOUTS} == {1, 2, 4} and {lay.tensor for lay in LAYOUTS} == {1, 2}
    assert {lay.data for lay in LAYOUTS} == {1, 2, 4, 8} and {lay.pipe for lay in LAYOUTS} == {1, 2, 3, 4, 5}
    assert GridLayout(2, 2, 2, 1, "chimera", 2) in LAYOUTS                     # one with all but tensor
    assert GridLayout(1, 2, 1, 4, "1f1b", 2) not in LAYOUTS                    # 2 heads over 4 ranks: no
    assert all(lay.micro_batches % lay.pipe == 0 for lay in LAYOUTS if lay.schedule == "chimera")


@pytest.mark.parametrize("world", sorted({lay.world for lay in LAYOUTS}))
def test_plan_minidist_mode_predicts_the_clock_and_the_ledger(world):
    layouts = [lay for lay in LAYOUTS if lay.world == world]
    measured = measure(SPEC, layouts, DEVICE, LINK)
    for lay in layouts:
        predicted = predict(SPEC, lay, DEVICE, LINK)
        assert len(predicted) == lay.pipe and len(measured[lay]) == world
        for position, seconds, states, activations in measured[lay]:
            p = predicted[position]
            assert seconds == pytest.approx(p["seconds"], rel=1e-9), lay
            assert (states, activations) == (p["states"], p["activations"]), lay


def test_plan_minidist_mode_predicts_zero1_over_the_data_axis():
    layouts = runnable_layouts(SPEC, fewest_micro_batches=True, zero1=True)    # every axis, D > 1
    expected = {lay for lay in fewest_micro_batches(
        brute_force_layouts(SPEC.layers, SPEC.heads, SPEC.ff, SPEC.seq, SPEC.batch)) if lay[0] > 1}
    assert {as_tuple(lay) for lay in layouts} == expected and len(layouts) == len(expected)    # 30
    assert all(lay.zero1 for lay in layouts)
    assert {lay.schedule for lay in layouts} == {"1f1b", "interleaved", "zb-h1", "chimera"}
    measured = measure(SPEC, layouts, DEVICE, LINK)
    for lay in layouts:
        predicted = predict(SPEC, lay, DEVICE, LINK)
        for position, seconds, states, activations in measured[lay]:
            p = predicted[position]
            assert seconds == pytest.approx(p["seconds"], rel=1e-9), lay
            assert (states, activations) == (p["states"], p["activations"]), lay


def _tensor_units(comm):
    units = split_for_mesh(build(), Mesh(comm, tensor=comm.world_size), SPEC.seq)
    return [sum(p.data.size for p in u.parameters()) for u in units.layers]


@pytest.mark.parametrize("tensor", [1, 2])
def test_plan_unit_params_match_the_gpt(tensor):
    assert sum(unit_params(SPEC)) == sum(p.data.size for p in build().parameters())
    assert unit_params(SPEC) == [sum(p.data.size for p in u.parameters()) for u in build().units()]
    assert all(sizes == unit_params(SPEC, tensor) for sizes in run(_tensor_units, tensor))


def test_plan_minidist_mode_states_by_category():
    gpt = build()
    full = predict_states(SPEC, one_f_one_b_schedule(1, 1), 1, 0)
    psi = sum(p.data.size for p in gpt.parameters())
    assert (full["parameters"], full["gradients"], full["optimizer"]) == (8 * psi, 8 * psi, 16 * psi)


def test_plan_minidist_clock_replica_sum_is_one_message_per_parameter():
    link = LinkModel(alpha=1e-6, beta=1e-9)           # 3 parameters of 10 words in all: 3α + 80β
    assert replica_sum_seconds(3, 10, 8, link) == pytest.approx(3 * link.alpha + 80 * link.beta, rel=1e-12)


def test_plan_minidist_mode_refuses_bad_units():
    with pytest.raises(ValueError, match="units must be the 5 units of a 2-block GPT"):
        predict_grid(SPEC, Sequential(*GPT(11, 8, 1, 8, 2, rng=np.random.default_rng(0)).units()),
                     one_f_one_b_schedule(1, 1), 1, 1)
    with pytest.raises(ValueError, match="d_ff = 4"):
        build_gpt(ModelSpec(layers=2, d_model=8, heads=2, seq=8, batch=8, vocab=11, d_ff=16))


def test_plan_minidist_mode_refuses_a_table_that_deadlocks():
    with pytest.raises(ValueError, match="deadlocks"):   # stage 1 waits for a stage 0 that nobody runs
        predict_step_seconds([[Task(0, "F", 0, 1)]], 2, [(1.0, 2.0, 0.0)] * 2, 0.5)
    # rank 0 is walked first but must wait for rank 1's stage 0: 2 seconds of work and one message
    waits = [[Task(0, "F", 0, 1)], [Task(1, "F", 0, 0)]]
    assert predict_step_seconds(waits, 2, [(1.0, 2.0, 0.0)] * 2, 0.5) == [2.5, 1.5]
