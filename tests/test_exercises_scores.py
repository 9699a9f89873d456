"""Scores weighted by promise: an exercise that promises several things (values, traffic, …) loses a
broken promise's share however few tests check it; one promise is scored by the fraction passed. And the
mutation check's wrong solutions still apply to the reference, each to an exercise that weighs promises."""

import pytest

from minidist_course.mutants import MUTANTS, write_mutant
from minidist_course.registry import EXERCISES
from minidist_course.results import TestResult as Outcome
from minidist_course.results import promise_score, score_exercises
from tests.test_exercises_grading import MADE_BY_THE_TOOLING, ROOT

WEIGHTS = {"values": 0.5, "traffic": 0.5}


def outcomes(results_by_promise: dict[str, list[str]]) -> list[Outcome]:
    return [Outcome(f"t.py::{promise}_{i}", ["ring_allreduce"], outcome, promise=promise)
            for promise, results in results_by_promise.items() for i, outcome in enumerate(results)]


def test_one_broken_promise_loses_its_share_however_few_tests_check_it():
    ignores_op = outcomes({"values": ["passed"] * 14 + ["failed"], "traffic": ["passed"] * 9})
    score, table = promise_score(ignores_op, WEIGHTS)
    assert score == 0.5 and table["values"] == [14, 15, 0.5, False] and table["traffic"][3]
    whole_arrays = outcomes({"values": ["passed"] * 15, "traffic": ["failed"] * 9})
    assert promise_score(whole_arrays, WEIGHTS)[0] == 0.5
    assert promise_score(outcomes({"values": ["passed"] * 3, "traffic": ["passed"]}), WEIGHTS)[0] == 1.0
    assert promise_score(outcomes({"values": ["failed"], "traffic": ["hung"]}), WEIGHTS)[0] == 0.0


def test_a_promise_with_no_test_run_is_left_out_and_one_promise_scores_the_fraction():
    only_values = outcomes({"values": ["passed", "passed"]})          # the traffic tests were skipped
    assert promise_score(only_values, WEIGHTS)[0] == 1.0
    assert promise_score(outcomes({"values": ["passed", "failed", "passed", "passed"]}), {})[0] == 0.75
    odd = outcomes({"values": ["passed"], "bitwise": ["failed"]})     # undeclared: counts for values
    assert promise_score(odd, WEIGHTS)[0] == 0.0
    [result], _ = score_exercises(outcomes({"values": ["passed"], "traffic": ["failed"]}), ["ring_allreduce"],
                                  {}, {"ring_allreduce": WEIGHTS})
    assert (result.score, result.passed, result.total) == (0.5, 1, 2)


def test_declared_promises_have_weights_that_sum_to_one():
    for ex in EXERCISES:
        if ex.promises:
            assert len(ex.promises) >= 2 and sum(w for _n, w in ex.promises) == pytest.approx(1.0), ex.id


@pytest.mark.skipif(MADE_BY_THE_TOOLING, reason="a student or instrumented copy holds no reference solutions")
def test_every_mutant_applies_once_to_an_exercise_that_weighs_its_promises(tmp_path):
    weighed = {ex.id for ex in EXERCISES if ex.promises}
    assert {"ring_allreduce", "tree_allreduce", "parameter_server_allreduce", "lamb_trust_ratio",
            "softmax_backward"} <= {m.exercise for m in MUTANTS} <= weighed
    for i, mutant in enumerate(MUTANTS):
        write_mutant(ROOT, tmp_path / str(i), mutant)
        assert (tmp_path / str(i) / mutant.path).read_text() != (ROOT / mutant.path).read_text()


def test_the_feedback_names_the_broken_promise():
    from minidist_course.grade import SubmissionReport
    from minidist_course.report import format_markdown, format_text
    from minidist_course.results import environment

    tests = outcomes({"values": ["passed"], "traffic": ["failed"]})
    tests[1].message = "AssertionError: rank 0 sent 96 bytes, the ring sends 48"
    [result], _ = score_exercises(tests, ["ring_allreduce"], {}, {"ring_allreduce": WEIGHTS})
    report = SubmissionReport("ada", "graded", 1.0, environment(2), [result])
    row = ("| `ring_allreduce` | 1/2 | 0.50 | promise broken: traffic. `traffic_0` failed: "
           "AssertionError: rank 0")
    assert row in format_markdown(report)
    assert "(promise broken: traffic)" in format_text(report)
