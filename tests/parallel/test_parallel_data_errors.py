"""Bad input to data parallelism: clear errors on every rank, never a hang; and the bucketed allreduce's
diagnosing check (which gradient, element and rank is wrong, or how many allreduces a bucket cost)."""

import numpy as np
import pytest

from minidist.cluster import ClusterError, run
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD
from minidist.parallel.data import DataParallel
from minidist.parallel.data.buckets import assign_buckets
from minidist.precision import FP16, MixedPrecisionTrainer
from tests.parallel.bucket_diagnosis import diagnose_bucket


def _mlp(seed, hidden=5, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return Sequential(
        Linear(3, hidden, rng=rng, dtype=dtype), ReLU(), Linear(hidden, 2, rng=rng, dtype=dtype)
    )


def _dp(comm, model, **kw):
    return DataParallel(comm, model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), **kw)


def _small_batch(comm):
    _dp(comm, _mlp(0)).train_step(np.zeros((2, 3)), np.zeros(2, dtype=int))


def _different_seeds(comm):
    _dp(comm, _mlp(comm.rank))


def _different_shapes(comm):
    _dp(comm, _mlp(0, hidden=5 + (comm.rank == 1)))


@pytest.mark.parametrize("fn, message", [
    (_small_batch, r"global batch of 2 examples cannot be split over 3 ranks.*P <= B"),
    (_different_seeds, r"replicas start different.*rank\(s\) \[1, 2\]"),
    (_different_shapes, r"same parameter shapes.*rank\(s\) \[1\]"),
])
def test_parallel_data_bad_start_is_a_clear_error(fn, message):
    with pytest.raises(ClusterError, match=message):
        run(fn, 3, timeout=30)


def _broadcast_and_check(comm):
    model = _mlp(comm.rank)
    dp = _dp(comm, model, broadcast_parameters=True)    # rank 0's values everywhere: the check passes
    values = [p.data.copy() for p in model.parameters()]
    if comm.rank == 2:
        model.parameters()[0].data[0, 0] += 1e-12
    try:
        dp.check_replicas()
    except ValueError as error:
        return values, str(error)
    return values, None


def test_parallel_data_broadcast_start_and_replica_check():
    per_rank = run(_broadcast_and_check, 3, timeout=30)
    reference = [p.data for p in _mlp(0).parameters()]
    for values, message in per_rank:
        assert all(np.array_equal(a, b) for a, b in zip(values, reference, strict=True))
        assert message is not None and "rank(s) [2]" in message


def _misuse(comm):
    model = _mlp(0)
    x, y = np.ones((4, 3)), np.zeros(4, dtype=int)
    errors = []

    def expect(kind, call):
        try:
            call()
        except kind as error:
            errors.append(str(error))
        else:
            errors.append(f"no {kind.__name__}")

    dp = _dp(comm, model)
    expect(RuntimeError, dp.step)                                        # nothing averaged yet
    dp.forward_backward(x, y)
    expect(RuntimeError, lambda: dp.forward_backward(x, y))             # would average twice
    dp.step()
    with dp.no_sync():
        dp.forward_backward(x, y)
    expect(RuntimeError, dp.step)                                        # last call was inside no_sync
    expect(ValueError, lambda: dp.forward_backward(x, y[:3]))
    expect(ValueError, lambda: _dp(comm, model, algorithm="bogus"))
    expect(ValueError, lambda: _dp(comm, model, bucket_bytes=0))
    expect(
        TypeError, lambda: DataParallel(comm, "model", SGD(model.parameters(), lr=0.1), CrossEntropyLoss())
    )
    expect(TypeError, lambda: DataParallel(comm, model, None, CrossEntropyLoss()))
    expect(TypeError, lambda: DataParallel(comm, model, SGD(model.parameters(), lr=0.1), None))
    other = _mlp(1, dtype=np.float32)
    trainer = MixedPrecisionTrainer(other, SGD(other.parameters(), lr=0.1), CrossEntropyLoss(), FP16)
    expect(ValueError, lambda: _dp(comm, model, mixed=trainer))
    return errors


def _replaced_grad(comm):
    model = _mlp(0)
    dp = _dp(comm, model, gradient_as_bucket_view=True)
    model.parameters()[0].grad = np.zeros((5, 3))        # a layer that rebinds .grad breaks the views
    dp.train_step(np.ones((4, 3)), np.zeros(4, dtype=int))


def test_parallel_data_bucket_view_detects_a_replaced_grad():
    with pytest.raises(ClusterError, match="Parameter.grad was replaced"):
        run(_replaced_grad, 2, timeout=30)


def test_parallel_data_misuse_is_a_clear_error():
    errors = run(_misuse, 1, timeout=30)[0]
    assert not any(e.startswith("no ") for e in errors), errors
    assert (
        "call step()" in errors[1] and "no_sync" in errors[2] and "same first (batch) dimension" in errors[3]
    )
    assert "algorithm must be one of" in errors[4] and "bucket_bytes must be" in errors[5]
    assert "same model and optimizer" in errors[9]


def test_parallel_data_buckets_fill_in_reverse_order():
    model = _mlp(0)          # W1 (5, 3), b1 (5,), W2 (2, 5), b2 (2,) in float64: 120, 40, 80, 16 bytes
    params = model.parameters()
    # b2 + W2 = 96 closes the first == [[(2,), (2, 5)], [(5,), (5, 3)]]
    assert [[p.shape for p in b.params] for b in assign_buckets(params, 96)]
    assert [len(b.params) for b in assign_buckets(params, 10**6)] == [4]
    assert [b.params[0] for b in assign_buckets(params, None)] == params[::-1]


def _diverging(comm):
    model = _mlp(0)
    dp = _dp(comm, model, check_every_step=True)
    x, y = np.ones((4, 3)), np.zeros(4, dtype=int)
    dp.train_step(x, y)                                   # identical: the check passes
    if comm.rank == 1:
        model.parameters()[1].data[0] += 1.0              # a bug that makes one replica drift
    dp.train_step(x, y)


@pytest.mark.exercise("dp_bucketed_allreduce")
def test_parallel_data_check_every_step_catches_a_drifting_replica():
    with pytest.raises(ClusterError, match=r"not bitwise identical.*rank\(s\) \[1\]"):
        run(_diverging, 2, timeout=30)


@pytest.mark.exercise("dp_bucketed_allreduce")
@pytest.mark.diagnose
def test_a_bucket_is_one_allreduce_whose_sums_land_in_their_own_gradients():
    for world in (1, 2, 3):
        wrong = diagnose_bucket(world)
        assert wrong is None, wrong
