"""measure_step: the peak activations and the products a step executes, plain and checkpointed."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.nn import Checkpoint, Linear, ReLU, Sequential
from minidist.nn.checkpoint import measure_step


def blocks(n_blocks: int, per_block: int, width: int, seed: int) -> list[Sequential]:
    rng = np.random.default_rng(seed)
    return [Sequential(*[m for _ in range(per_block) for m in (Linear(width, width, rng=rng), ReLU())])
            for _ in range(n_blocks)]


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 8), st.integers(1, 5))
def test_products_are_three_forward_units_plain_and_four_checkpointed(n_blocks, per_block, width, batch):
    x = np.random.default_rng(0).standard_normal((batch, width)).astype(np.float32)
    linears = n_blocks * per_block
    _, plain = measure_step(Sequential(*blocks(n_blocks, per_block, width, 1)), x)
    checkpointed_model = Sequential(*[Checkpoint(b) for b in blocks(n_blocks, per_block, width, 1)])
    _, checkpointed = measure_step(checkpointed_model, x)
    assert plain == 3 * linears and checkpointed == 4 * linears


def test_peak_is_all_activations_plain_and_inputs_plus_one_block_checkpointed():
    n_blocks, per_block, width, batch = 5, 2, 16, 8
    x = np.random.default_rng(0).standard_normal((batch, width)).astype(np.float32)
    plain_peak, _ = measure_step(Sequential(*blocks(n_blocks, per_block, width, 1)), x)
    # each Linear keeps its float32 input, each ReLU a one-byte mask
    per_pair = batch * width * 4 + batch * width
    assert plain_peak == n_blocks * per_block * per_pair
    ck_peak, _ = measure_step(Sequential(*[Checkpoint(b) for b in blocks(n_blocks, per_block, width, 1)]), x)
    # every block input kept (the first is the caller's x, also counted) + one block recomputed
    assert ck_peak == n_blocks * batch * width * 4 + per_block * per_pair - batch * width * 4


def test_wrappers_are_removed_and_gradients_unchanged():
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    measured, reference = Sequential(*blocks(2, 2, 6, 3)), Sequential(*blocks(2, 2, 6, 3))
    measure_step(measured, x)
    reference.backward(np.ones_like(reference.forward(x)))
    for layer in measured.modules():
        assert "forward" not in vars(layer) and "backward" not in vars(layer)
    for p, q in zip(measured.parameters(), reference.parameters(), strict=True):
        np.testing.assert_array_equal(p.grad, q.grad)


def test_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="Module"):
        measure_step(np.zeros(3), np.zeros(3))
