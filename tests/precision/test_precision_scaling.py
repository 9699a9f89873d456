"""Loss scalers: GradScaler's scale sequence (vs torch on CPU when installed, and hand-computed)."""

import numpy as np
import pytest

from minidist.precision import DynamicLossScaler, StaticLossScaler
from tests.precision.scaling_diagnosis import diagnose_loss_scaler

DLS = pytest.mark.exercise("dynamic_loss_scaling")
# a scripted overflow pattern: True = this step's gradients hold Inf/NaN
PATTERN = [False, False, False, True, False, True, True, False, False, False, False, False, False, False]


@DLS
@pytest.mark.diagnose
def test_update_follows_gradscalers_rule_step_by_step():
    wrong = diagnose_loss_scaler(DynamicLossScaler)
    assert wrong is None, wrong


def run_scaler(scaler, pattern):
    scales = []
    for found_inf in pattern:
        scaler.update(found_inf)
        scales.append(scaler.scale)
    return scales


@DLS
def test_scale_sequence_hand_computed():
    scaler = DynamicLossScaler(init_scale=8.0, growth_interval=3)
    # 3 clean steps → 16; Inf → 8; clean; Inf → 4; Inf → 2; 3 clean → 4; 3 clean → 8; 1 clean
    assert run_scaler(scaler, PATTERN) == [8, 8, 16, 8, 8, 4, 2, 2, 2, 4, 4, 4, 8, 8]
    assert scaler.clean_steps == 1


@DLS
@pytest.mark.slow  # importing torch takes seconds on a busy machine
def test_scale_sequence_matches_torch_gradscaler():
    torch = pytest.importorskip("torch")
    ref = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=3)
    weight = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([weight], lr=0.1)
    expected, applied = [], []
    for found_inf in PATTERN:
        ref.scale(weight.sum())  # initialises the scale tensor, as a real loss would
        before = weight.detach().clone()
        weight.grad = torch.tensor([float("inf") if found_inf else 1.0, 1.0])
        ref.step(opt)
        ref.update()
        expected.append(ref.get_scale())
        applied.append(not torch.equal(before, weight.detach()))
    mine = DynamicLossScaler(init_scale=8.0, growth_interval=3)
    assert run_scaler(mine, PATTERN) == expected
    assert applied == [not f for f in PATTERN]      # torch skips exactly the overflowing steps too


@DLS
def test_defaults_and_min_scale_floor():
    scaler = DynamicLossScaler()
    assert (scaler.scale, scaler.growth_factor, scaler.backoff_factor, scaler.growth_interval) == \
        (65536.0, 2.0, 0.5, 2000)
    run_scaler(scaler, [True] * 20)
    assert scaler.scale == 2.0**-4
    floored = DynamicLossScaler(init_scale=1024.0, min_scale=256.0)
    assert run_scaler(floored, [True] * 5) == [512, 256, 256, 256, 256]
    floored.min_scale = 2048.0                 # "enhanced" loss scaling raises the floor on a schedule
    floored.update(True)
    assert floored.scale == 2048.0


def test_unscale_divides_in_place_and_reports_overflow():
    grads = [np.array([2.0, 4.0], dtype=np.float32), np.array([[8.0]])]
    keep = grads[0]
    assert StaticLossScaler(2.0).unscale(grads) is False
    assert grads[0] is keep and list(grads[0]) == [1.0, 2.0] and grads[1][0, 0] == 4.0
    assert DynamicLossScaler().unscale([np.array([1.0, np.inf])]) is True
    assert DynamicLossScaler().unscale([np.array([np.nan])]) is True
    static = StaticLossScaler(128)
    static.update(True)
    assert static.scale == 128.0


def test_bad_hyper_parameters():
    for kwargs in ({"init_scale": 0}, {"init_scale": np.inf}, {"growth_factor": 1.0},
                   {"backoff_factor": 1.5}, {"growth_interval": 0}, {"min_scale": -1.0}):
        with pytest.raises(ValueError):
            DynamicLossScaler(**kwargs)
    with pytest.raises(TypeError):
        StaticLossScaler("1024")
    with pytest.raises(TypeError):
        StaticLossScaler(2.0).unscale([[1.0, 2.0]])


@pytest.mark.parametrize("make", [lambda: StaticLossScaler(4), lambda: DynamicLossScaler(init_scale=4.0)],
                         ids=["static", "dynamic"])
def test_unscale_checks_the_whole_list_before_dividing_any(make):
    """Issue 18 item 5: a bad entry used to raise only after the float arrays before it were divided."""
    scaler = make()
    g_float = np.array([8.0, 12.0])
    read_only = np.array([4.0])
    read_only.flags.writeable = False
    for bad in ([g_float, np.array([4, 8])], [g_float, [4.0]], [g_float, read_only]):
        with pytest.raises((TypeError, ValueError), match=r"grads\[1\]"):
            scaler.unscale(bad)
        assert g_float.tolist() == [8.0, 12.0]
    with pytest.raises(TypeError, match="list of gradient arrays"):
        scaler.unscale(g_float)
    assert scaler.unscale([g_float]) is False and g_float.tolist() == [2.0, 3.0]


@pytest.mark.parametrize("make", [lambda: StaticLossScaler(4), lambda: DynamicLossScaler(init_scale=4.0)],
                         ids=["static", "dynamic"])
def test_update_takes_a_bool(make):
    scaler = make()
    for flag in ("no", 0, 1.0, None):
        with pytest.raises(TypeError, match="found_inf must be True or False"):
            scaler.update(flag)
    assert scaler.scale == 4.0
    scaler.update(np.True_)
    assert scaler.scale == (4.0 if isinstance(scaler, StaticLossScaler) else 2.0)
