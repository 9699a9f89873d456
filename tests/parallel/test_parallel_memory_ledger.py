"""The wrappers feed a MemoryLedger themselves (memory=ledger): the recorded peaks equal the formulas.

Model: Linear(5, 7), ReLU, Linear(7, 3), float64 (b = 8): Ψ = 66 in layers of 42 and 24; Adam (K = 2b,
its state allocated when it is built). bucket_bytes=None: one bucket (ZeRO: one group) per parameter,
so Ψ_r = Σ_parameters split_sizes(size, P)[r] and a layer's gradient buckets live together.

    DataParallel   (2b + K)Ψ, plus bΨ of bucket buffers when P > 1
    ZeRO-1         2bΨ + KΨ_r
    ZeRO-2         bΨ + (b + K)Ψ_r + b·max Ψ_l   (a layer's full gradient until its reduce-scatter)
    ZeRO-3         (2b + K)Ψ_r + 2b·max Ψ_l       (a layer's gathered parameters and full gradient)
and the total peak adds the activations held after forward. Mixed precision (fp32 masters, b = 4 for the
emulated FP16 values, K = 4 + 8; one bucket of 66): ZeRO-1 8Ψ + 12Ψ_r, ZeRO-2 4Ψ + 16Ψ_r, ZeRO-3 20Ψ_r after
a step.
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.collectives.pieces import split_sizes
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import Adam
from minidist.parallel.data import DataParallel
from minidist.parallel.data.zero import ZeRO
from minidist.parallel.data.zero_mixed import ShardedMixedPrecision
from minidist.precision import FP16
from minidist.sim.memory import MODEL_STATES, MemoryLedger

SIZES, LAYERS, BATCH = [35, 7, 21, 3], [42, 24], 8


def _model(dtype):
    rng = np.random.default_rng(3)
    return Sequential(Linear(5, 7, rng=rng, dtype=dtype), ReLU(), Linear(7, 3, rng=rng, dtype=dtype))


def _ledger(comm, stage, mixed=False):
    dtype = np.float32 if mixed else np.float64
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(BATCH, 5)).astype(dtype), rng.integers(0, 3, size=BATCH)
    ledger, model = MemoryLedger(comm.rank), _model(dtype)
    if stage == 0:
        wrapper = DataParallel(comm, model, Adam(model.parameters()), CrossEntropyLoss(), bucket_bytes=None,
                               memory=ledger)
    else:
        options = {"mixed": ShardedMixedPrecision(FP16)} if mixed else {}
        wrapper = ZeRO(
            comm,
            model,
            lambda ps: Adam(ps),
            CrossEntropyLoss(),
            stage=stage,
            memory=ledger,
            **options,
            **({} if stage == 3 else {"bucket_bytes": 10**6 if mixed else None}),
        )
    for _ in range(2):
        wrapper.train_step(x, y)
    return ledger


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_parallel_memory_ledger_peaks_equal_the_formulas(world_size, stage):
    b, k, psi = 8, 16, sum(SIZES)
    for r, ledger in enumerate(run(_ledger, world_size, stage)):
        labels = [label for _, label, _ in ledger.timeline]
        assert labels[:2] == ["after forward", "backward layer 2"] or stage == 3
        assert labels.count("after step") == 2 and "after backward" in labels
        psi_r = sum(split_sizes(n, world_size)[r] for n in (SIZES if stage < 3 else LAYERS))
        states = {
            0: (2 * b + k) * psi,
            1: 2 * b * psi + k * psi_r,
            2: b * psi + (b + k) * psi_r + b * max(LAYERS),
            3: (2 * b + k) * psi_r + 2 * b * max(LAYERS),
        }[stage]
        assert ledger.peak(MODEL_STATES) == states
        buffers = b * psi if stage == 0 and world_size > 1 else 0
        assert ledger.peak("buffers") == buffers
        n_r = split_sizes(BATCH, world_size)[r]
        # the global batch x (its slice is a view), the ReLU's 1-byte mask, the second Linear's input
        activations = BATCH * 5 * b + n_r * 7 + n_r * 7 * b
        assert ledger.peak("activations") == activations
        assert ledger.peak() == states + buffers + activations


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_parallel_memory_ledger_mixed_precision_equals_the_papers_formula(stage):
    psi, world_size = sum(SIZES), 2
    for r, ledger in enumerate(run(_ledger, world_size, stage, True)):
        held = ledger.timeline[-1][2]
        psi_r = sum(split_sizes(n, world_size)[r] for n in ([psi] if stage < 3 else LAYERS))
        assert psi_r == psi // 2                    # P = 2 divides every parameter and layer here
        low = {1: (4 * psi, 4 * psi), 2: (4 * psi, 4 * psi_r), 3: (4 * psi_r, 4 * psi_r)}[stage]
        assert (held["parameters"], held["gradients"], held["optimizer"]) == (*low, 12 * psi_r)
        # with real 2-byte FP16 storage: the paper's 2Ψ + 2Ψ + 12Ψ/P, 2Ψ + 14Ψ/P, 16Ψ/P
        paper = held["parameters"] // 2 + held["gradients"] // 2 + held["optimizer"]
        assert paper == {1: 4 * psi + 12 * psi / 2, 2: 2 * psi + 14 * psi / 2, 3: 16 * psi / 2}[stage]
