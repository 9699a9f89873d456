"""Exercise vocab_parallel_cross_entropy on cases chosen by hand: a fixed split on two ranks, logits far too
large for a naive exp, and every target on one side of the split (the target's logit comes from the one
rank whose slice holds it)."""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.parallel.tensor import VocabParallelCrossEntropy, feature_slice
from tests.parallel.test_parallel_tensor_vocab import TOL, _loss_on_ranks, _reference
from tests.parallel.vocab_diagnosis import diagnose_vocab_cross_entropy

vocab_exercise = pytest.mark.exercise("vocab_parallel_cross_entropy")


@vocab_exercise
@pytest.mark.diagnose
def test_each_shard_has_the_global_max_sum_and_target_logit():
    wrong = diagnose_vocab_cross_entropy(VocabParallelCrossEntropy)
    assert wrong is None, wrong


def _check(logits, target, t):
    want, want_grad = _reference(logits, target)
    for rank, (loss, grad, _stats) in enumerate(run(_loss_on_ranks, t, logits, target)):
        assert loss == pytest.approx(want, rel=1e-12, abs=1e-12), rank
        np.testing.assert_allclose(grad, want_grad[..., feature_slice(logits.shape[-1], t, rank)], **TOL)


@vocab_exercise
def test_a_fixed_case_on_two_ranks():
    logits = np.array([[1.0, 2.0, 0.5, -1.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0], [4.0, -2.0, 1.0, 1.0, 0.0]])
    _check(logits, np.array([4, 2, 0]), 2)


@vocab_exercise
@pytest.mark.parametrize("t", [2, 3])
def test_logits_too_large_for_a_naive_exp_stay_exact(t):
    rng = np.random.default_rng(t)
    logits = 1e4 * rng.standard_normal((4, 7))          # exp(1e4) overflows: the max must come out first
    _check(logits, rng.integers(0, 7, 4), t)


@vocab_exercise
@pytest.mark.parametrize("side", ["first", "last"])
def test_every_target_on_one_side_of_the_split(side):
    rng = np.random.default_rng(5)
    logits, t = rng.standard_normal((6, 9)), 3
    cols = feature_slice(9, t, 0 if side == "first" else t - 1)
    _check(logits, rng.integers(cols.start, cols.stop, 6), t)
