"""Data parallelism equals single-process full-batch training, per parameter, after every step.

hypothesis draws the world size (1-4), the model, global batch sizes that P need not divide, the
allreduce algorithm, the bucket size, overlap on/off and the optimizer. One cluster run per example
trains three variants on every rank: the drawn configuration (gradients copied into the buckets or kept
as views of them), the same without bucketing (one allreduce per parameter), and gradient accumulation over k
micro-steps (no_sync) — and returns the parameters of
every replica after every step.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.cluster import run
from minidist.collectives import ALGORITHMS
from minidist.collectives.pieces import split_range
from minidist.nn import CrossEntropyLoss
from minidist.parallel.data import DataParallel
from tests.parallel.data_parallel_helpers import (
    MODELS,
    OPTIMIZERS,
    make_data,
    make_model,
    make_optimizer,
    single_process,
)

RTOL, ATOL = 1e-10, 1e-13      # float64; atol only guards parameters that pass near zero
# each element summed in rank order, whatever the buckets
ORDER_FREE = ("naive", "parameter_server", "tree", "shared_memory")


def _train(comm, case, batches, bucket_bytes, accumulate=1, views=False):
    model = make_model(case["model"], case["seed"])
    opt = make_optimizer(case["optimizer"], model.parameters())
    dp = DataParallel(comm, model, opt, CrossEntropyLoss(), algorithm=case["algorithm"],
                      bucket_bytes=bucket_bytes, overlap=case["overlap"], gradient_as_bucket_view=views)
    history, silent = [], True
    for start in range(0, len(batches), accumulate):
        dp.zero_grad()
        before = comm.stats.bytes_sent
        with dp.no_sync():
            for x, y in batches[start:start + accumulate - 1]:
                dp.forward_backward(x, y)
        silent &= comm.stats.bytes_sent == before          # no_sync: no communication at all
        dp.forward_backward(*batches[start + accumulate - 1])
        dp.step()
        history.append([p.data.copy() for p in model.parameters()])
    return history, silent


def _variants(comm, case):
    batches = make_data(case["model"], case["seed"], case["batch_sizes"])
    micro = make_data(case["model"], case["seed"] + 1, [case["micro_batch"]] * (2 * case["k"]))
    return {"drawn": _train(comm, case, batches, case["bucket_bytes"], views=case["views"])[0],
            "unbucketed": _train(comm, case, batches, None)[0],
            "accumulated": _train(comm, case, micro, case["bucket_bytes"], accumulate=case["k"])}


def _assert_replicas_identical(histories, what):
    for step, params in enumerate(histories[0]):
        for rank, other in enumerate(histories[1:], start=1):
            for i, (a, b) in enumerate(zip(params, other[step], strict=True)):
                assert a.tobytes() == b.tobytes(), (
                    f"{what}: rank {rank} differs from rank 0 in parameter {i} after step {step}"
                )


def _assert_matches(got, want, what):
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        for i, (a, b) in enumerate(zip(g, w, strict=True)):
            np.testing.assert_allclose(
                a, b, rtol=RTOL, atol=ATOL, err_msg=f"{what}: parameter {i}, step {step}"
            )


@st.composite
def cases(draw):
    p = draw(st.integers(1, 4))
    return {"world_size": p, "model": draw(st.sampled_from(MODELS)), "seed": draw(st.integers(0, 2**16)),
            "batch_sizes": draw(st.lists(st.integers(p, 3 * p + 3), min_size=2, max_size=3)),
            "algorithm": draw(st.sampled_from([*sorted(ALGORITHMS), "shared_memory"])),
            "bucket_bytes": draw(st.sampled_from([None, 1, 100, 400, 10**6])),
            "overlap": draw(st.booleans()), "optimizer": draw(st.sampled_from(OPTIMIZERS)),
            "views": draw(st.booleans()),
            "micro_batch": draw(st.integers(p, 2 * p + 1)), "k": draw(st.integers(2, 3))}


@pytest.mark.exercise("dp_bucketed_allreduce")
@given(cases())
def test_parallel_data_equals_single_process_full_batch(case):
    per_rank = run(_variants, case["world_size"], case, timeout=120)
    batches = make_data(case["model"], case["seed"], case["batch_sizes"])
    want = single_process(case["model"], case["optimizer"], case["seed"], batches)
    for variant in ("drawn", "unbucketed"):
        histories = [r[variant] for r in per_rank]
        _assert_replicas_identical(histories, variant)
        _assert_matches(histories[0], want, f"{variant} vs one process")
    # bucketing on/off: bitwise the same where the summation order does not depend on the chunking
    drawn, unbucketed = per_rank[0]["drawn"], per_rank[0]["unbucketed"]
    if case["algorithm"] in ORDER_FREE:
        _assert_replicas_identical([drawn, unbucketed], "bucketed vs unbucketed")
    else:
        _assert_matches(drawn, unbucketed, "bucketed vs unbucketed")
    # k micro-steps of m examples equal one step on k*m examples
    micro = make_data(case["model"], case["seed"] + 1, [case["micro_batch"]] * (2 * case["k"]))
    accumulated = [r["accumulated"][0] for r in per_rank]
    assert all(r["accumulated"][1] for r in per_rank), "no_sync must not communicate"
    _assert_replicas_identical(accumulated, "accumulated")
    _assert_matches(accumulated[0], single_process(case["model"], case["optimizer"], case["seed"], micro,
                                                   micro_steps=case["k"]), "accumulation vs k-times batch")


@pytest.mark.parametrize("batch, world_size", [(7, 3), (10, 4), (4, 4), (5, 1)])
def test_parallel_data_shards_like_array_split(batch, world_size):
    pieces = np.array_split(np.arange(batch), world_size)
    for rank in range(world_size):
        lo, hi = split_range(batch, world_size, rank)
        assert np.array_equal(np.arange(lo, hi), pieces[rank])
