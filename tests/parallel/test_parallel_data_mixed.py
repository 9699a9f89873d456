"""Mixed precision under data parallelism skips exactly the steps single-process training skips.

Two sources of overflow: the dynamic loss scale (2^20 overflows FP16 in dlogits = s·(p − onehot)/B,
2^19 does not; it grows back every 2 clean steps) and an input of 1e6 (> 65504) placed in one batch on
the last rank's shard only. The overflow flag is reduced across ranks (max), so every replica skips.
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD
from minidist.parallel.data import DataParallel
from minidist.precision import FP16, DynamicLossScaler, MixedPrecisionTrainer

STEPS, BATCH, POISONED = 8, 10, 5


def _setup():
    rng = np.random.default_rng(3)
    model = Sequential(Linear(6, 8, rng=rng), ReLU(), Linear(8, 4, rng=rng))
    for p in model.parameters():
        p.data *= 0.1            # small logits: p ~ 1/4, so |dlogits| * B ~ 0.75 decides the overflow
    optimizer = SGD(model.parameters(), lr=0.01, momentum=0.9)
    trainer = MixedPrecisionTrainer(model, optimizer, CrossEntropyLoss(), FP16,
                                    scaler=DynamicLossScaler(init_scale=2.0**20, growth_interval=2))
    data = np.random.default_rng(4)
    batches = [(0.01 * data.normal(size=(BATCH, 6)).astype(np.float32), data.integers(0, 4, size=BATCH))
               for _ in range(STEPS)]
    batches[POISONED][0][-1, 0] = 1e6   # the last example: on the last rank's shard
    return model, optimizer, trainer, batches


def _data_parallel(comm, views):
    model, optimizer, trainer, batches = _setup()
    dp = DataParallel(comm, model, optimizer, CrossEntropyLoss(), mixed=trainer, bucket_bytes=64,
                      gradient_as_bucket_view=views)
    applied, scales, params = [], [], []
    for x, y in batches:
        dp.zero_grad()
        dp.forward_backward(x, y)
        applied.append(dp.step())
        scales.append(trainer.scaler.scale)
        params.append([p.data.copy() for p in model.parameters()])
    return applied, scales, params


@pytest.mark.parametrize("world_size, views", [
    pytest.param(3, False, marks=pytest.mark.exercise("dp_bucketed_allreduce")),
    (2, True),               # gradients as views of the buckets: the allreduce runs on them directly
])
def test_parallel_data_mixed_precision_skips_with_single_process(world_size, views):
    model, _, trainer, batches = _setup()
    want_applied, want_scales = [], []
    with np.errstate(over="ignore", invalid="ignore"):
        for x, y in batches:
            want_applied.append(trainer.train_step(x, y)[1])
            want_scales.append(trainer.scaler.scale)
    assert not all(want_applied) and any(want_applied)      # the scenario has both kinds of step
    assert not want_applied[POISONED]
    per_rank = run(_data_parallel, world_size, views, timeout=60)
    for rank, (applied, scales, params) in enumerate(per_rank):
        assert applied == want_applied, f"rank {rank}"
        assert scales == want_scales, f"rank {rank}"
        for step, step_params in enumerate(params):
            for a, b in zip(step_params, per_rank[0][2][step], strict=True):
                assert a.tobytes() == b.tobytes(), f"rank {rank} differs from rank 0 after step {step}"
        for a, p in zip(params[-1], model.parameters(), strict=True):
            assert np.all(np.isfinite(a))
            np.testing.assert_allclose(a, p.data, rtol=0, atol=1e-3)   # FP16 rounding of partial sums differs
