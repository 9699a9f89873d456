"""dynamic_loss_scaling's own tests: DynamicLossScaler.update against the rule written out here.

The rule (torch.amp.GradScaler's): on Inf/NaN multiply the scale by backoff_factor and restart the count
of clean steps; after growth_interval clean steps in a row multiply it by growth_factor (unless that
overflows to Inf) and restart the count; never go below min_scale.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.precision import DynamicLossScaler


def expected_scales(init, growth, backoff, interval, min_scale, flags):
    scale, clean, out = max(init, min_scale or 0.0), 0, []
    for found_inf in flags:
        if found_inf:
            scale, clean = scale * backoff, 0
        else:
            clean += 1
            if clean == interval:
                if math.isfinite(scale * growth):
                    scale *= growth
                clean = 0
        if min_scale is not None:
            scale = max(scale, min_scale)
        out.append(scale)
    return out


@given(flags=st.lists(st.booleans(), max_size=60), interval=st.integers(1, 5),
       growth=st.sampled_from([2.0, 1.5, 4.0]), backoff=st.sampled_from([0.5, 0.25, 0.9]),
       init=st.sampled_from([1.0, 2.0**16, 3.0]), min_scale=st.sampled_from([None, 0.5, 2.0**10]))
def test_update_follows_the_rule_step_by_step(flags, interval, growth, backoff, init, min_scale):
    scaler = DynamicLossScaler(init, growth, backoff, interval, min_scale=min_scale)
    got = []
    for found_inf in flags:
        scaler.update(found_inf)
        got.append(scaler.scale)
    assert got == expected_scales(init, growth, backoff, interval, min_scale, flags)


def test_an_overflow_restarts_the_count_of_clean_steps():
    scaler = DynamicLossScaler(8.0, growth_interval=3)
    for found_inf in (False, False, True, False, False):
        scaler.update(found_inf)
    assert scaler.scale == 4.0            # backed off once, not yet grown again (2 clean steps of 3)
    scaler.update(False)
    assert scaler.scale == 8.0


def test_the_scale_never_grows_into_infinity():
    scaler = DynamicLossScaler(2.0**1023, growth_interval=1)
    scaler.update(False)
    assert scaler.scale == 2.0**1023


@pytest.mark.parametrize("steps", [1, 7, 2000])
def test_growth_waits_for_exactly_growth_interval_clean_steps(steps):
    scaler = DynamicLossScaler(1.0, growth_interval=steps)
    for _ in range(steps - 1):
        scaler.update(False)
    assert scaler.scale == 1.0
    scaler.update(False)
    assert scaler.scale == 2.0


def test_a_training_loop_skips_overflowing_steps_and_recovers():
    """The loop of a mixed-precision trainer: unscale, skip on overflow, update the scale."""
    scaler = DynamicLossScaler(2.0**4, growth_interval=2)
    w, applied = np.zeros(3), 0
    for _step, g in enumerate([np.ones(3), np.full(3, np.inf), np.ones(3), np.ones(3), np.ones(3)]):
        grads = [g * scaler.scale]
        found_inf = scaler.unscale(grads)
        if not found_inf:
            w -= 0.1 * grads[0]
            applied += 1
        scaler.update(found_inf)
    assert applied == 4 and scaler.scale == 2.0**4   # 16 → 8 (overflow) → 16 after two clean steps
    np.testing.assert_allclose(w, -0.4)
