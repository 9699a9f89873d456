"""The ring all-reduce checked step by step (tests/collectives/ring_diagnosis.py): these run first under
`pytest --exercise ring_allreduce`, so a wrong ring's first failure says which phase, step, rank and chunk."""

import pytest

from minidist.cluster import run
from tests.collectives.ring_diagnosis import diagnose_ring, diagnose_ring_op, ring_trace

pytestmark = [pytest.mark.exercise("ring_allreduce"), pytest.mark.diagnose]


def test_ring_steps_hold_the_partial_sums_the_schedule_says():
    for p, n in ((4, 8), (3, 6), (2, 4), (5, 10), (3, 7), (4, 9)):   # equal chunks first
        wrong = diagnose_ring(run(ring_trace, p, n, timeout=60), n)
        assert wrong is None, f"P={p}, n={n}: {wrong}"


def test_ring_reduce_scatter_applies_the_op():
    for op in ("max", "min"):
        wrong = diagnose_ring_op(run(ring_trace, 3, 7, op, timeout=60), 7, op)
        assert wrong is None, wrong
