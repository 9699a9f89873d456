"""Mismatched calls across ranks end in a clear error within seconds, never a hang; bad input is refused."""

import time

import numpy as np
import pytest

from minidist.cluster import ClusterError, run
from minidist.collectives import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)
from minidist.collectives.common import check_comm

MISMATCHES = {
    # rank 0 makes one call, the other ranks another; then everyone carries on with a ring allreduce
    "length": (lambda c: allreduce(c, np.ones(8)), lambda c: allreduce(c, np.ones(9))),
    "dtype": (lambda c: allreduce(c, np.ones(8, np.float32)), lambda c: allreduce(c, np.ones(8))),
    "algorithm": (lambda c: allreduce(c, np.ones(8), algorithm="tree"),
                  lambda c: allreduce(c, np.ones(8), algorithm="ring")),
    "algorithm_ps": (lambda c: allreduce(c, np.ones(8), algorithm="parameter_server"),
                     lambda c: allreduce(c, np.ones(8), algorithm="recursive_doubling")),
    "op": (lambda c: allreduce(c, np.ones(8), op="max"), lambda c: allreduce(c, np.ones(8))),
    "root": (lambda c: broadcast(c, np.ones(3), root=0), lambda c: broadcast(c, np.ones(3), root=1)),
    "collective": (lambda c: reduce(c, np.ones(3)), lambda c: allgather(c, np.ones(3))),
}


def _mismatched(comm, name):
    first, others = MISMATCHES[name]
    (first if comm.rank == 0 else others)(comm)
    allreduce(comm, np.ones(4))


@pytest.mark.parametrize("world_size", [2, 5])
@pytest.mark.parametrize("name", sorted(MISMATCHES))
def test_mismatched_calls_raise_promptly(name, world_size):
    start = time.perf_counter()
    with pytest.raises(ClusterError, match="collective mismatch"):
        run(_mismatched, world_size, name, timeout=60.0)
    assert time.perf_counter() - start < 30, "the mismatch must be reported, not found by the timeout"


def _bad_inputs(comm):
    errors = []
    attempts = [
        lambda: allreduce(comm, [1.0, 2.0]),
        lambda: allreduce(comm, np.ones(3, bool)),
        lambda: allreduce(comm, np.ones(3), op="avg"),
        lambda: allreduce(comm, np.ones(3), algorithm="butterfly"),
        lambda: allreduce(comm, np.ones(3, np.int32), op="mean"),
        lambda: broadcast(comm, np.ones(3), root=comm.world_size),
        lambda: reduce(comm, np.ones(3), root=-1),
        lambda: gather(comm, "x"),
        lambda: scatter(comm, [np.ones(1)] * 2),  # one array per rank, and there is one rank
        lambda: alltoall(comm, [np.ones(1)] * 2),
        lambda: reduce_scatter(comm, np.ones(3), op="prod"),
    ]
    for attempt in attempts:
        try:
            attempt()
            errors.append(None)
        except (TypeError, ValueError) as e:
            errors.append((type(e).__name__, str(e)))
    return errors


def test_bad_input_gives_clear_errors():
    errors = run(_bad_inputs, 1)[0]  # checked before any message moves, so one rank suffices
    kinds = [e and e[0] for e in errors]
    assert kinds == ["TypeError", "TypeError", "ValueError", "ValueError", "TypeError", "ValueError",
                     "ValueError", "TypeError", "ValueError", "ValueError", "ValueError"], errors
    assert "numpy array" in errors[0][1] and "float or integer" in errors[1][1]
    assert "'avg'" in errors[2][1] and "butterfly" in errors[3][1] and "root" in errors[5][1]


def test_not_a_communicator():
    with pytest.raises(TypeError, match="Communicator"):
        check_comm(object())
    with pytest.raises(TypeError, match="Communicator"):
        allreduce(None, np.ones(3))
