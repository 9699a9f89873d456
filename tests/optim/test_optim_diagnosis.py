"""Optimizers checked step by step against their recurrences (tests/optim/optimizer_diagnosis.py): these
run first under `pytest --exercise sgd_momentum` / `adam`, so a wrong update's first failure names the
step and the state (or the parameter) that diverged."""

import functools

import pytest

from minidist.optim import SGD, Adam
from tests.optim.optimizer_diagnosis import (
    adam_reference,
    diagnose_optimizer,
    diagnose_trust_ratio,
    sgd_reference,
)

SGD_CASES = (dict(momentum=0.9), dict(momentum=0.9, dampening=0.5), dict(momentum=0.8, nesterov=True),
             dict(momentum=0.9, weight_decay=0.1))
ADAM_CASES = (dict(), dict(betas=(0.5, 0.9)), dict(amsgrad=True), dict(weight_decay=0.1))


@pytest.mark.exercise("sgd_momentum")
@pytest.mark.diagnose
def test_sgd_momentum_buffer_and_parameter_follow_the_recurrence():
    for options in SGD_CASES:
        wrong = diagnose_optimizer(functools.partial(SGD, lr=0.1, **options),
                                   functools.partial(sgd_reference, lr=0.1, **options), f"SGD({options})")
        assert wrong is None, wrong


@pytest.mark.exercise("adam")
@pytest.mark.diagnose
def test_adam_moments_and_parameter_follow_the_recurrence():
    for options in ADAM_CASES:
        wrong = diagnose_optimizer(functools.partial(Adam, lr=0.01, **options),
                                   functools.partial(adam_reference, lr=0.01, **options), f"Adam({options})")
        assert wrong is None, wrong


@pytest.mark.exercise("lamb_trust_ratio")
@pytest.mark.diagnose
def test_lamb_trust_ratio_is_the_norm_ratio_with_its_zero_cases():
    from minidist.optim.lamb import lamb_trust_ratio

    wrong = diagnose_trust_ratio(lamb_trust_ratio)
    assert wrong is None, wrong
