"""The naive data parallelism (one allreduce per parameter after backward) equals single-process
full-batch training per parameter after several steps, and sends what the ring formula says."""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import CrossEntropyLoss
from minidist.parallel.data import NaiveDataParallel
from tests.parallel.data_parallel_helpers import make_data, make_model, make_optimizer, single_process


def _train(comm, kind, optimizer, batches):
    model = make_model(kind, 3)
    dp = NaiveDataParallel(comm, model, make_optimizer(optimizer, model.parameters()), CrossEntropyLoss())
    history, sent = [], []
    for x, y in batches:
        before = comm.stats.bytes_sent
        dp.train_step(x, y)
        sent.append(comm.stats.bytes_sent - before)
        history.append([p.data.copy() for p in model.parameters()])
    return history, sent


@pytest.mark.parametrize("world_size, kind, optimizer", [(1, "mlp", "sgd"), (2, "nested", "adam"),
                                                        (3, "conv", "sgd_nesterov")])
def test_naive_data_parallel_equals_one_process_per_parameter(world_size, kind, optimizer):
    batches = make_data(kind, 3, [7, 5, 9])
    expected = single_process(kind, optimizer, 3, batches)
    results = run(_train, world_size, kind, optimizer, batches)
    sizes = [p.size for p in make_model(kind, 3).parameters()]
    for history, sent in results:
        for got, want in zip(history, expected, strict=True):
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-13)
        # ring allreduce of n float64 elements: each rank sends 2 (P-1)/P n elements when P | n; in all
        # cases between the two ceilings of the chunked ring
        p = world_size
        low = sum(2 * 8 * (n - -(-n // p)) for n in sizes)
        high = sum(2 * 8 * (n - n // p) for n in sizes)
        assert all(low <= s <= high for s in sent), (sent, low, high)


def test_naive_data_parallel_refuses_a_batch_smaller_than_the_ranks():
    def body(comm):
        model = make_model("mlp", 0)
        dp = NaiveDataParallel(comm, model, make_optimizer("sgd", model.parameters()), CrossEntropyLoss())
        with pytest.raises(ValueError, match="P <= B"):
            dp.train_step(np.zeros((1, 6)), np.zeros(1, dtype=int))
        return True
    assert run(body, 2) == [True, True]
