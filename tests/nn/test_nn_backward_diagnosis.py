"""Backward passes checked array by array (tests/nn/backward_diagnosis.py): these run first under
`pytest --exercise linear` (conv2d_backward, batchnorm_backward), so a wrong backward's first failure says
which of dX, dW, db is off and its first wrong index; cross_entropy_backward names dlogits and the shape,
lstm_cell_backward the gate (i, f, g, o) or dc_prev."""

import numpy as np
import pytest

from minidist.nn import BatchNorm1d, Conv2d, Linear
from tests.nn.backward_diagnosis import (
    diagnose_backward,
    diagnose_cross_entropy,
    diagnose_lstm_cell,
    diagnose_softmax_backward,
)


@pytest.mark.exercise("linear")
@pytest.mark.diagnose
def test_linear_dx_dw_db_match_central_differences():
    rng = np.random.default_rng(0)
    for n, i, o in ((4, 3, 2), (1, 5, 5), (6, 2, 7)):
        wrong = diagnose_backward(Linear(i, o, rng=rng, dtype=np.float64), rng.standard_normal((n, i)), rng,
                                  f"Linear({i}, {o}), batch {n}")
        assert wrong is None, wrong


@pytest.mark.exercise("conv2d_backward")
@pytest.mark.diagnose
def test_conv2d_dx_dw_db_match_central_differences():
    rng = np.random.default_rng(1)
    for c, o, k, stride, padding in ((2, 3, 3, 1, 1), (1, 2, 2, 2, 0)):
        conv = Conv2d(c, o, k, stride, padding, rng=rng, dtype=np.float64)
        wrong = diagnose_backward(conv, rng.standard_normal((2, c, 5, 5)), rng,
                                  f"Conv2d({c}, {o}, {k}, stride={stride}, padding={padding})")
        assert wrong is None, wrong


@pytest.mark.exercise("batchnorm_backward")
@pytest.mark.diagnose
def test_batchnorm_dx_dgamma_dbeta_match_central_differences():
    rng = np.random.default_rng(2)
    for n, c in ((5, 3), (2, 1)):
        norm = BatchNorm1d(c, dtype=np.float64)
        norm.weight.data[...] = rng.standard_normal(c)
        wrong = diagnose_backward(norm, rng.standard_normal((n, c)), rng, f"BatchNorm1d({c}), batch {n}")
        assert wrong is None, wrong


@pytest.mark.exercise("softmax_backward")
@pytest.mark.diagnose
def test_softmax_backward_is_the_jacobian_product_along_every_axis():
    from minidist.nn.softmax import softmax_backward

    wrong = diagnose_softmax_backward(softmax_backward, np.random.default_rng(3))
    assert wrong is None, wrong


@pytest.mark.exercise("cross_entropy_backward")
@pytest.mark.diagnose
def test_cross_entropy_dlogits_match_central_differences_for_batches_and_sequences():
    from minidist.nn.loss import CrossEntropyLoss

    wrong = diagnose_cross_entropy(CrossEntropyLoss, np.random.default_rng(4))
    assert wrong is None, wrong


@pytest.mark.exercise("lstm_cell_backward")
@pytest.mark.diagnose
def test_lstm_cell_dgates_and_dc_prev_match_central_differences_gate_by_gate():
    from minidist.nn.rnn import lstm_cell_backward, lstm_cell_forward

    wrong = diagnose_lstm_cell(lstm_cell_forward, lstm_cell_backward, np.random.default_rng(5))
    assert wrong is None, wrong
