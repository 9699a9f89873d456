"""Issue 58, hardening round 5 (items 4, 5, 6, 7, 10): bad input refused at the call, with an error naming
the argument and the value, before anything changes; and one input each that today's code takes as a user
expects (one array clipped as one gradient). Every test failed before the fix."""

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.__main__ import main
from minidist.collectives.chain import best_segments, chain_broadcast, chain_broadcast_time
from minidist.nn import CrossEntropyLoss, Linear, MSELoss, ReLU, Sequential, Tanh
from minidist.nn.batch_renorm import BatchRenorm2d
from minidist.nn.hessian_exact import exact_hessian_vector_product
from minidist.nn.instance_norm import InstanceNorm2d
from minidist.nn.norm import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm
from minidist.nn.online_norm import OnlineNorm
from minidist.optim import SGD
from minidist.parallel.data.sync import GradientSync
from minidist.parallel.mesh import Mesh, MeshShape
from minidist.parallel.pipeline.pipedream import replay, synchronous
from minidist.parallel.pipeline.weight_stash import WeightStash
from minidist.precision.fp8_training import clip_grad_norm_, fp8_trainer


def snapshot(model) -> list[bytes]:
    return [p.data.tobytes() for p in model.parameters()]


# -- 4: clip_grad_norm_ --------------------------------------------------------------------------------------
@given(st.lists(st.floats(-100, 100), min_size=1, max_size=6), st.floats(0.1, 10))
def test_one_array_is_clipped_as_one_gradient(values, max_norm):
    """torch clips a single tensor: one bare array is the list of that one array."""
    alone, listed = np.array(values), [np.array(values)]
    assert clip_grad_norm_(alone, max_norm) == clip_grad_norm_(listed, max_norm)
    assert alone.tobytes() == listed[0].tobytes()
    assert np.linalg.norm(alone) <= max_norm * (1 + 1e-12)


def test_one_array_of_norm_five_is_scaled_to_max_norm():
    g = np.array([3.0, 4.0])
    assert clip_grad_norm_(g, 1.0) == 5.0
    assert np.linalg.norm(g) == pytest.approx(1.0, rel=1e-6)


def test_gradients_that_cannot_be_scaled_in_place_are_refused_before_any_is_changed():
    float_grad = np.array([30.0, 40.0])
    with pytest.raises(TypeError, match=r"grads\[1\] must be a floating-point ndarray .*got dtype int64"):
        clip_grad_norm_([float_grad, np.array([3, 4])], 1.0)
    assert float_grad.tolist() == [30.0, 40.0]                    # nothing scaled before the refusal
    with pytest.raises(TypeError, match=r"grads\[0\] must be a floating-point ndarray .*got list"):
        clip_grad_norm_([[3.0, 4.0]], 1.0)
    with pytest.raises(TypeError, match="grads must be an ndarray or a list of ndarrays, got float"):
        clip_grad_norm_(3.0, 1.0)


# -- 5: exact_hessian_vector_product's batch ---------------------------------------------------------------
def mlp() -> Sequential:
    rng = np.random.default_rng(0)
    return Sequential(Linear(3, 4, rng=rng, dtype=np.float64), Tanh(),
                      Linear(4, 2, rng=rng, dtype=np.float64))


@pytest.mark.parametrize("loss_fn, x, y, message", [
    (CrossEntropyLoss(), np.ones((4, 3)), np.array([0, 1, 0, -1]), r"labels must lie in \[0, 2\).*-1"),
    (CrossEntropyLoss(), np.ones((4, 3)), np.array([0, 1, 0, 2]), r"labels must lie in \[0, 2\).*2\]"),
    (CrossEntropyLoss(), np.ones((4, 3)), np.array([0, 1, 0]), r"one label per row of x, shape \(4,\)"),
    (CrossEntropyLoss(), np.ones((4, 5)), np.array([0, 1, 0, 1]), r"in_features = 3 columns, got shape"),
    (MSELoss(), np.ones((4, 3)), np.ones((4, 3)), r"output's shape \(4, 2\) for MSELoss, got shape \(4, 3\)"),
    (MSELoss(), np.ones((0, 3)), np.ones((0, 2)), r"N >= 1"),
])
def test_exact_hvp_refuses_a_batch_that_does_not_match_the_model(loss_fn, x, y, message):
    model = mlp()
    v = [np.ones_like(p.data) for p in model.parameters()]
    with pytest.raises(ValueError, match=message):
        exact_hessian_vector_product(model, loss_fn, x, y, v)


def test_exact_hvp_refuses_float_labels():
    model = mlp()
    v = [np.ones_like(p.data) for p in model.parameters()]
    with pytest.raises(TypeError, match="integer class labels .*float64"):
        exact_hessian_vector_product(model, CrossEntropyLoss(), np.ones((2, 3)), np.array([0.0, 1.0]), v)


# -- 6: accepted, then failing late -------------------------------------------------------------------------
def test_fp8_trainer_refuses_an_int_rng_before_any_step():
    model = Sequential(Linear(3, 2, rng=np.random.default_rng(0)))
    with pytest.raises(TypeError, match="rng must be a numpy Generator .*got int 3"):
        fp8_trainer(model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), rng=3)


def test_gradient_sync_refuses_an_unknown_algorithm_at_construction():
    with pytest.raises(ValueError, match="algorithm must be one of .*got 'bogus'"):
        GradientSync(mlp(), None, algorithm="bogus")


def stream(m: int, rows: int = 2):
    rng = np.random.default_rng(1)
    return list(rng.standard_normal((m, rows, 3))), list(rng.standard_normal((m, rows, 2)))


def sgd(params):
    return SGD(params, lr=0.1)


@pytest.mark.parametrize("boundaries", [[0], [], [0, 2], [0, 3, 2, 3], [1, 3]])
def test_pipedream_replay_refuses_boundaries_that_do_not_split_the_model(boundaries):
    model, (xs, targets) = mlp(), stream(4)
    before = snapshot(model)
    with pytest.raises(ValueError, match="do not split 3 layers"):
        replay(model, MSELoss(), xs, targets, sgd, boundaries)
    assert snapshot(model) == before


@pytest.mark.parametrize("train", [lambda *a: replay(*a, [0, 1, 3]), lambda *a: synchronous(*a, 1)])
def test_pipedream_replay_refuses_xs_and_targets_of_different_lengths(train):
    model, (xs, targets) = mlp(), stream(4)
    before = snapshot(model)
    with pytest.raises(ValueError, match="xs and targets must have one length .*got 4 and 3"):
        train(model, MSELoss(), xs, targets[:3], sgd)
    assert snapshot(model) == before


NORMS = {"BatchNorm1d": lambda eps: BatchNorm1d(3, eps=eps),
         "BatchNorm2d": lambda eps: BatchNorm2d(3, eps=eps),
         "LayerNorm": lambda eps: LayerNorm(3, eps=eps), "GroupNorm": lambda eps: GroupNorm(1, 3, eps=eps),
         "InstanceNorm2d": lambda eps: InstanceNorm2d(3, eps=eps),
         "BatchRenorm2d": lambda eps: BatchRenorm2d(3, eps=eps),
         "OnlineNorm": lambda eps: OnlineNorm(3, eps=eps)}


@pytest.mark.parametrize("name", NORMS)
def test_every_norm_refuses_an_eps_that_is_not_finite_and_positive(name):
    for eps in (math.nan, math.inf, 0.0, -1e-5):
        with pytest.raises(ValueError, match=f"{name}.*eps"):
            NORMS[name](eps)
    with pytest.raises(TypeError, match=f"{name}: eps must be a real number, got str"):
        NORMS[name]("1e-5")
    assert NORMS[name](1e-3).eps == 1e-3


def test_weight_stash_end_backward_without_a_forward_is_a_clear_error():
    stage = Linear(2, 2, rng=np.random.default_rng(0))
    stash = WeightStash(stage, SGD(stage.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="end_backward without a forward in flight"):
        stash.end_backward()
    assert stash.latest == 0 and stash.applied == []


# -- 7: plan --mode minidist ------------------------------------------------------------------------------
TINY = ["plan", "--layers", "2", "--d-model", "8", "--heads", "2", "--seq", "8", "--batch", "8",
        "--vocab", "11"]


@pytest.mark.parametrize("extra, message", [
    (["--mode", "minidist", "--vocab", str(10**12)], "builds the model in float64: .* parameters and their"),
    (["--mode", "minidist", "--d-model", "100000"], "more than the .* it builds"),
    (["--mode", "minidist", "--devices", "100000", "--batch", "100000"], "runs at most 64 ranks"),
    (["--mode", "minidist", "--devices", "8", "--batch", "100000"], "a layout walks 12,500 micro-batches"),
    (["--mode", "minidist", "--memory=--"], "argument --memory: expected a value, got '--'"),
    (["--memory=--"], "argument --memory: expected a value, got '--'"),
    (["--hardware=--"], "argument --hardware: expected a value, got '--'"),
    (["--measure"], "--measure is an option of minidist mode, not read in analytic mode"),
    (["--alpha", "1e-6"], "--alpha is an option of minidist mode"),
    (["--mode", "minidist", "--explain"], "--explain is an option of analytic mode, not read in minidist"),
    (["--mode", "minidist", "--eager"], "--eager is an option of analytic mode"),
    (["--mode", "minidist", "--zero", "0,1,2"], "--zero is an option of analytic mode"),
])
def test_plan_refuses_in_one_line(capsys, extra, message):
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--devices", "2", *extra])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and err.startswith("python -m minidist plan: error:")
    assert re.search(message, err), err


def test_plan_minidist_table_walk_limit_counts_every_layout(capsys):
    """B / D passes the first check, the layouts' tables together do not: refused after listing them,
    before any is priced."""
    with pytest.raises(SystemExit):
        main([*TINY, "--mode", "minidist", "--devices", "8", "--batch", "1024"])
    assert "their task tables cost" in capsys.readouterr().err


# -- 10: small ones ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha, beta, name", [(-1e-6, 1e-9, "alpha"), (math.nan, 1e-9, "alpha"),
                                               (1e-6, math.inf, "beta"), (1e-6, -1.0, "beta")])
def test_chain_costs_refuse_negative_and_non_finite_alpha_beta(alpha, beta, name):
    with pytest.raises(ValueError, match=f"{name} must be a finite number >= 0"):
        best_segments(8, 1000, alpha, beta)
    with pytest.raises(ValueError, match=f"{name} must be a finite number >= 0"):
        chain_broadcast_time(8, 1000, 4, alpha, beta)


def test_chain_broadcast_time_refuses_zero_segments():
    with pytest.raises(ValueError, match="segments must be an integer >= 1, got 0"):
        chain_broadcast_time(8, 1000, 0, 1e-6, 1e-9)


def test_a_bool_root_is_not_a_rank():
    comm = SimpleNamespace(rank=0, world_size=2, send=None, recv=None, sendrecv=None)   # never reached
    with pytest.raises(TypeError, match="root must be a rank, an integer in \\[0, 2\\), got the bool True"):
        chain_broadcast(comm, np.ones(4), root=True)


def test_batch_renorm_names_the_argument_that_is_not_a_number():
    with pytest.raises(TypeError, match="BatchRenorm2d: r_max must be a real number, got str '3'"):
        BatchRenorm2d(3, r_max="3")


def test_mesh_needs_a_communicator_and_distinct_axis_names():
    with pytest.raises(TypeError, match="comm must be a Communicator, got NoneType"):
        Mesh(None)
    with pytest.raises(TypeError, match="comm must be a Communicator, got NoneType"):
        Mesh.of_shape(None, MeshShape({"data": 1}))
    with pytest.raises(ValueError, match=r"mesh axis names must be distinct, got \['data', 'data'\]"):
        MeshShape([("data", 2), ("data", 3)])
    assert MeshShape([("data", 2), ("tensor", 3)]).world_size == 6


def test_relu_mlp_still_takes_a_good_batch():
    """The checks take what they should: an exact HVP on a well-formed batch still runs."""
    rng = np.random.default_rng(2)
    model = Sequential(Linear(3, 4, rng=rng, dtype=np.float64), ReLU(),
                       Linear(4, 2, rng=rng, dtype=np.float64))
    v = [np.ones_like(p.data) for p in model.parameters()]
    out = exact_hessian_vector_product(model, CrossEntropyLoss(), rng.standard_normal((5, 3)),
                                       np.array([0, 1, 1, 0, 1]), v)
    assert [o.shape for o in out] == [p.data.shape for p in model.parameters()]
