"""Bad input gets a clear ValueError/TypeError saying what was expected."""

import numpy as np
import pytest

from minidist.cluster import ClusterError, run


@pytest.mark.parametrize("world_size", [0, -2, 1.5, True, "2"])
def test_world_size_must_be_a_positive_int(world_size):
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        run(lambda comm: None, world_size)


def test_other_run_arguments():
    with pytest.raises(TypeError, match="function"):
        run(42, 2)
    with pytest.raises(ValueError, match="timeout"):
        run(lambda comm: None, 2, timeout=0)
    with pytest.raises(ValueError, match="start_method"):
        run(lambda comm: None, 2, start_method="teleport")


def in_rank(call):
    """Run ``call(comm)`` on rank 0 of two; rank 1 does nothing."""
    def fn(comm):
        if comm.rank == 0:
            call(comm)
    return fn


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda comm: comm.send(np.ones(2), 2),
            r"ValueError: dst must be another rank in 0..1 \(this is rank 0\), got 2",
        ),
        (lambda comm: comm.send(np.ones(2), -1), "ValueError: dst must be another rank"),
        (lambda comm: comm.send(np.ones(2), 0), "ValueError: dst must be another rank.*got 0"),
        (lambda comm: comm.send(np.ones(2), 1.0), "TypeError: dst must be an int rank, got float"),
        (lambda comm: comm.recv(0), "ValueError: src must be another rank.*got 0"),
        (lambda comm: comm.recv(5), "ValueError: src must be another rank.*got 5"),
        (lambda comm: comm.send([1, 2], 1), "TypeError: send expects a numpy array, got list"),
        (lambda comm: comm.send(3.0, 1), "TypeError: send expects a numpy array, got float"),
        (
            lambda comm: comm.send(np.array([None]), 1),
            "TypeError: send expects a numeric, bool or string dtype",
        ),
        (lambda comm: comm.send(np.ones(2), 1, tag=-1), "ValueError: tag must be an int >= 0"),
        (lambda comm: comm.recv(1, out=np.ones(2), op="mean"), "ValueError: op must be one of"),
        (lambda comm: comm.recv(1, op="sum"), "ValueError: op='sum' combines into out="),
        (lambda comm: comm.recv(1, out=[0.0]), "TypeError: out must be a numpy array"),
        (
            lambda comm: comm.recv(1, out=np.ones(2), base=np.ones(2)),
            "ValueError: base= is what op= combines",
        ),
        (
            lambda comm: comm.recv(1, out=np.ones(2), op="sum", base=np.ones(3)),
            r"ValueError: base must have out's dtype and shape float64 \(2,\), got float64 \(3,\)",
        ),
        (
            lambda comm: comm.recv(1, out=np.ones(2), op="sum", base=[1.0, 2.0]),
            "TypeError: base must be a numpy array",
        ),
        (lambda comm: comm.compute(-1), "ValueError: compute expects flops >= 0"),
        (lambda comm: comm.split("red"), "TypeError: split expects an int color"),
    ],
)
def test_bad_arguments_inside_a_rank(call, message):
    with pytest.raises(ClusterError, match="rank 0 raised " + message):
        run(in_rank(call), 2, timeout=20)
