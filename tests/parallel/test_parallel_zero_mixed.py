"""ZeRO stages 1-3 with mixed precision (fp32 master shards) equal DataParallel with MixedPrecisionTrainer.

Both run the same recipe (low-precision forward/backward, scaled loss, the summed gradient rounded to
grad_fmt, unscale, a step skipped on Inf/NaN by every rank, fp32 update) on every rank of one cluster run.
P <= 2: each summed element has at most two terms, so the order cannot matter: bitwise. P = 3: ring
allreduce and reduce-scatter add the three terms in different orders, so a float32 sum may differ in its
last bit; the gradient is then rounded to FP16/BF16 and Adam's normalised steps keep such differences
near lr·2^-8 per step: tolerance atol 1e-3 (lr = 0.01, 4 steps).
"""

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import CrossEntropyLoss
from minidist.parallel.data import DataParallel
from minidist.parallel.data.zero import ZeRO
from minidist.parallel.data.zero_mixed import ShardedMixedPrecision
from minidist.precision import BF16, FP16, quantize
from minidist.precision.mixed import MixedPrecisionTrainer
from minidist.precision.scaling import DynamicLossScaler, StaticLossScaler
from tests.parallel.data_parallel_helpers import make_data, make_model, make_optimizer

FORMATS = {"fp16": (FP16, FP16), "bf16": (BF16, BF16), "fp16/bf16": (FP16, BF16)}


def scaler(grad_fmt):
    """Step 1 overflows (s = 2^24 for FP16 gradients; 2^140, Inf in float32, for BF16's range), the scale
    backs off to 2^10 and grows every 2 clean steps."""
    top = 24 if grad_fmt == FP16 else 140
    return DynamicLossScaler(init_scale=2.0**top, backoff_factor=2.0**(10 - top), growth_interval=2)


def _both(comm, case, batches):
    fmt, grad_fmt = FORMATS[case["formats"]]
    model = make_model(case["model"], case["seed"], dtype=np.float32)
    opt = make_optimizer(case["optimizer"], model.parameters())
    mixed = MixedPrecisionTrainer(
        model, opt, CrossEntropyLoss(), fmt, grad_fmt=grad_fmt, scaler=scaler(grad_fmt)
    )
    dp = DataParallel(comm, model, opt, CrossEntropyLoss(), mixed=mixed, bucket_bytes=200)
    zero = ZeRO(comm, make_model(case["model"], case["seed"], dtype=np.float32),
                              lambda shards: make_optimizer(case["optimizer"], shards), CrossEntropyLoss(),
                              stage=case["stage"],
                              mixed=ShardedMixedPrecision(fmt, grad_fmt=grad_fmt, scaler=scaler(grad_fmt)),
                              **({} if case["stage"] == 3 else {"bucket_bytes": 200}))
    history = []
    for x, y in batches:
        dp.zero_grad()
        dp.forward_backward(x, y)
        applied = dp.step()
        before = comm.stats.bytes_sent
        zero.train_step(x, y)
        sent = comm.stats.bytes_sent - before
        history.append({"applied": (applied, zero.applied), "sent": (sent, zero.bytes_per_step(zero.applied)),
                        "scale": (mixed.scaler.scale, zero.mixed.scaler.scale),
                        "masters": ([p.data.copy() for p in model.parameters()], zero.master_parameters()),
                        "working": zero.full_parameters()})
    return history, fmt


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_parallel_zero_mixed_equals_data_parallel_mixed_per_parameter(world_size, stage):
    model = ("mlp", "nested", "tanh_layernorm")[(stage + world_size) % 3]
    case = {
        "model": model,
        "seed": 5 + stage,
        "stage": stage,
        "optimizer": ("adam", "sgd", "adamw")[stage - 1],
        "formats": ("fp16", "bf16", "fp16/bf16")[world_size - 1],
    }
    batches = make_data(model, case["seed"], [7, 8, 9, 6, 8])
    for history, fmt in run(_both, world_size, case, batches, timeout=120):
        assert [h["applied"] for h in history][:2] == [(False, False), (True, True)]   # step 1 overflowed
        for h in history:
            assert h["applied"][0] == h["applied"][1] and h["scale"][0] == h["scale"][1]
            assert h["sent"][0] == h["sent"][1]
            for dp_master, zero_master, working in zip(*h["masters"], h["working"], strict=True):
                if world_size <= 2:
                    np.testing.assert_array_equal(zero_master, dp_master)
                    np.testing.assert_array_equal(working, quantize(dp_master, fmt, saturate=True))
                else:
                    np.testing.assert_allclose(zero_master, dp_master, rtol=0, atol=1e-3)
                np.testing.assert_array_equal(working, quantize(zero_master, fmt, saturate=True))
        assert sum(h["applied"][1] for h in history) == 4


def _overflow_on_one_rank(comm, stage):
    """Only rank 1's data overflows: every rank must skip the step (the flag is allreduced)."""
    model = make_model("mlp", 1, dtype=np.float32)
    zero = ZeRO(
        comm,
        model,
        lambda ps: make_optimizer("sgd", ps),
        CrossEntropyLoss(),
        stage=stage,
        mixed=ShardedMixedPrecision(FP16, scaler=StaticLossScaler(2.0**10)),
    )
    before = [p.copy() for p in zero.master_parameters()]
    x, y = make_data("mlp", 1, [4])[0]
    x = x.astype(np.float32)
    x[2:] *= 1e6                             # rank 1's half of the batch: Inf in its gradients
    zero.train_step(x, y)
    after = zero.master_parameters()
    return zero.applied, all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_parallel_zero_mixed_skips_the_step_on_every_rank_when_one_finds_inf(stage):
    assert run(_overflow_on_one_rank, 2, stage) == [(False, True), (False, True)]


def _errors(comm):
    messages = []
    make = lambda ps: make_optimizer("sgd", ps)  # noqa: E731
    calls = (
        lambda: ZeRO(
            comm,
            make_model("mlp", 0),
            make,
            CrossEntropyLoss(),
            stage=1,
            # float64 model
            mixed=ShardedMixedPrecision(FP16),
        ),
        lambda: ZeRO(
            comm,
            make_model("mlp", 0, np.float32),
            make,
            CrossEntropyLoss(),
            stage=2,
            mixed=MixedPrecisionTrainer(
                make_model("mlp", 0, np.float32),
                make(make_model("mlp", 0).parameters()),
                CrossEntropyLoss(),
                FP16,
            ),
        ),
        lambda: ShardedMixedPrecision(FP16, scaler=2.0**10),
    )
    for call in calls:
        with pytest.raises((TypeError, ValueError)) as info:
            call()
        messages.append(str(info.value))
    shared = ShardedMixedPrecision(FP16)
    ZeRO(
        comm, make_model("mlp", 0, np.float32), make, CrossEntropyLoss(), stage=3, mixed=shared
    )
    with pytest.raises(ValueError, match="one per wrapper"):
        ZeRO(
            comm, make_model("mlp", 0, np.float32), make, CrossEntropyLoss(), stage=1, mixed=shared
        )
    plain = ZeRO(comm, make_model("mlp", 0, np.float32), make, CrossEntropyLoss(), stage=2)
    mixed = ZeRO(comm, make_model("mlp", 0, np.float32), make, CrossEntropyLoss(), stage=2,
                               mixed=ShardedMixedPrecision(FP16))
    with pytest.raises(ValueError, match="mixed precision"):
        plain.load_state_dict(mixed.state_dict())
    return messages


def test_parallel_zero_mixed_bad_combinations_give_clear_errors():
    float64, trainer, bad_scaler = run(_errors, 2)[0]
    assert "float32" in float64 and "ShardedMixedPrecision" in trainer and "scaler" in bad_scaler
