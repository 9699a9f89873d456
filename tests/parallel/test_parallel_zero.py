"""ZeRO-1, ZeRO-2 and ZeRO-3/FSDP equal DataParallel per parameter after several steps; their measured
memory per rank equals the ZeRO paper's formulas; the bytes they send equal the ring formulas.

One cluster run per example trains DataParallel and the sharded wrapper side by side on every rank
(float64). With P <= 2 every element of a sum has two terms, so the order cannot matter: bitwise.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.cluster import run
from minidist.collectives.pieces import split_sizes
from minidist.nn import CrossEntropyLoss, Linear, ReLU, Sequential
from minidist.optim import SGD, Adam
from minidist.parallel.data import DataParallel
from minidist.parallel.data.zero import ZeRO
from minidist.sim.memory import MemoryLedger
from tests.parallel.data_parallel_helpers import MODELS, make_data, make_model, make_optimizer

ELEMENTWISE = ("sgd", "sgd_nesterov", "adam", "adamw", "rmsprop", "adagrad")


def _both(comm, case, batches):
    model = make_model(case["model"], case["seed"])
    dp = DataParallel(comm, model, make_optimizer(case["optimizer"], model.parameters()), CrossEntropyLoss(),
                      bucket_bytes=case["bucket_bytes"])
    sharded_model = make_model(case["model"], case["seed"])
    options = {} if case["stage"] == 3 else {"bucket_bytes": case["bucket_bytes"]}
    zero = ZeRO(comm, sharded_model, lambda shards: make_optimizer(case["optimizer"], shards),
                              CrossEntropyLoss(), stage=case["stage"], **options)
    history, sent = [], []
    for x, y in batches:
        dp.train_step(x, y)
        before = comm.stats.bytes_sent
        zero.train_step(x, y)
        sent.append((comm.stats.bytes_sent - before, zero.bytes_per_step()))
        history.append(([p.data.copy() for p in model.parameters()], zero.full_parameters()))
    return history, sent


@given(st.fixed_dictionaries({
    "world_size": st.integers(1, 4), "stage": st.integers(1, 3), "model": st.sampled_from(MODELS),
    "optimizer": st.sampled_from(ELEMENTWISE), "seed": st.integers(0, 2**16),
    "bucket_bytes": st.sampled_from([None, 200, 10**6])}),
    st.lists(st.integers(4, 9), min_size=3, max_size=3))
def test_parallel_zero_equals_data_parallel_per_parameter(case, batch_sizes):
    batches = make_data(case["model"], case["seed"], batch_sizes)
    results = run(_both, case["world_size"], case, batches, timeout=120)
    for history, sent in results:
        for dp_params, zero_params in history:
            assert len(dp_params) == len(zero_params)
            for a, b in zip(dp_params, zero_params, strict=True):
                if case["world_size"] <= 2:
                    np.testing.assert_array_equal(b, a)
                else:
                    np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-15)
        for measured, formula in sent:
            assert measured == formula


def _memory(comm, stage, optimizer, widths, bucket_bytes):
    rng = np.random.default_rng(3)
    layers = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [Linear(a, b, rng=rng, dtype=np.float64), ReLU()]
    model = Sequential(*layers[:-1])
    make = {"sgd": lambda ps: SGD(ps, lr=0.1), "momentum": lambda ps: SGD(ps, lr=0.1, momentum=0.9),
            "adam": lambda ps: Adam(ps, lr=1e-3)}[optimizer]
    x, y = rng.normal(size=(8, widths[0])), rng.integers(0, widths[-1], size=8)
    ledger = MemoryLedger(comm.rank)
    if stage == 0:
        dp = DataParallel(
            comm, model, make(model.parameters()), CrossEntropyLoss(), gradient_as_bucket_view=True
        )
        before = comm.stats.bytes_sent
        dp.train_step(x, y)
        from minidist.sim.memory import held_bytes
        held = held_bytes(model, dp.optimizer)
        return held, comm.stats.bytes_sent - before, None, None, None
    zero = ZeRO(comm, model, make, CrossEntropyLoss(), stage=stage, memory=ledger,
                              **({} if stage == 3 else {"bucket_bytes": bucket_bytes}))
    before = comm.stats.bytes_sent
    zero.train_step(x, y)
    largest = zero.largest_layer() if stage == 3 else None
    gathered = [h for _, label, h in ledger.timeline if "gathered" in label]
    return zero.held(), comm.stats.bytes_sent - before, zero.shard_elements(), largest, gathered


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("optimizer,k", [("sgd", 0), ("momentum", 1), ("adam", 2)])
def test_parallel_zero_memory_and_bytes_equal_the_formulas(world_size, optimizer, k):
    widths, b = (5, 7, 3), 8                      # Ψ = 42 + 24 = 66 float64 parameters, layers 42 and 24
    psi = 5 * 7 + 7 + 7 * 3 + 3
    dp = run(_memory, world_size, 0, optimizer, widths, 10**6)
    for held, _sent, *_ in dp:
        assert (held["parameters"], held["gradients"], held["optimizer"]) == (b * psi, b * psi, k * b * psi)
    for stage in (1, 2, 3):
        for r, (held, sent, psi_r, largest, gathered) in enumerate(
                run(_memory, world_size, stage, optimizer, widths, 10**6)):
            # one bucket (stages 1-2) or one group per layer (stage 3); Ψ_r = Σ_groups split_sizes(n, P)[r]
            groups = [psi] if stage < 3 else [42, 24]
            assert psi_r == sum(split_sizes(n, world_size)[r] for n in groups)
            expected = {1: (b * psi, b * psi, k * b * psi_r), 2: (b * psi, b * psi_r, k * b * psi_r),
                        3: (b * psi_r, b * psi_r, k * b * psi_r)}[stage]
            assert (held["parameters"], held["gradients"], held["optimizer"]) == expected
            # reduce-scatter: every piece but mine, once; allgather: my piece to each of the P − 1 others
            rs = sum(b * (n - split_sizes(n, world_size)[r]) for n in groups)
            ag = sum(b * (world_size - 1) * split_sizes(n, world_size)[r] for n in groups)
            assert sent == rs + ag + (ag if stage == 3 else 0)
            if stage == 3:
                assert largest == 42
                # while a layer runs its full parameters are held as well (and in backward its full gradient)
                peak_extra = max(h["parameters"] + h["gradients"] for h in gathered) - 2 * b * psi_r
                assert peak_extra == 2 * b * 42
    if world_size == 2:                            # P divides both layers: the textbook forms
        assert dp[0][1] == 2 * (world_size - 1) / world_size * b * psi
        assert (
            run(_memory, 2, 3, optimizer, widths, 10**6)[0][1] == 3 * (world_size - 1) / world_size * b * psi
        )


def _errors(comm):
    rng = np.random.default_rng(0)
    make = lambda ps: SGD(ps, lr=0.1)  # noqa: E731
    shared = Linear(4, 4, rng=rng, dtype=np.float64)
    tied = Sequential(shared, ReLU(), shared)
    messages = []
    for call in (
        lambda: ZeRO(comm, tied, make, CrossEntropyLoss(), stage=1),
        lambda: ZeRO(comm, make_model("mlp", 0), make, CrossEntropyLoss(), stage=4),
        lambda: ZeRO(comm, make_model("mlp", 0), make, CrossEntropyLoss(), stage=0),
        lambda: ZeRO(
            comm, make_model("mlp", 0), lambda ps: make_optimizer("lars", ps), CrossEntropyLoss(), stage=2
        ),
        lambda: ZeRO(
            comm,
            make_model("mlp", 0),
            SGD(make_model("mlp", 0).parameters(), lr=1),
            CrossEntropyLoss(),
            stage=1,
        ),
    ):
        with pytest.raises((ValueError, TypeError)) as info:
            call()
        messages.append(str(info.value))
    model = make_model("mlp", 0)
    for stage in (1, 2, 3):                       # a refused optimizer leaves the model as it was
        with pytest.raises(TypeError, match="LARS"):
            ZeRO(
                comm, model, lambda ps: make_optimizer("lars", ps), CrossEntropyLoss(), stage=stage
            )
        assert all(p.data is not None and p.data.base is None for p in model.parameters())
    return messages


def test_parallel_zero_bad_input_gives_clear_errors():
    shared, stage4, stage0, lars, built = run(_errors, 2)[0]
    assert "shared" in shared and "layers 0 and 2" in shared
    assert "1, 2 or 3" in stage4 and "1, 2 or 3" in stage0
    assert "LARS" in lars
    assert "make_optimizer must be a function" in built


def _state(comm, stage, saved):
    model = make_model("mlp", 1)
    zero = ZeRO(comm, model, lambda ps: Adam(ps, lr=0.01), CrossEntropyLoss(), stage=stage)
    x, y = make_data("mlp", 1, [8])[0]
    if saved is None:
        zero.train_step(x, y)
        return zero.state_dict()
    try:
        zero.load_state_dict(saved[comm.rank % len(saved)])
    except ValueError as error:
        return str(error)
    return "loaded"


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_parallel_zero_optimizer_state_from_another_world_size_is_refused(stage):
    from_three = run(_state, 3, stage, None)
    assert all("P = 3" in message for message in run(_state, 2, stage, from_three))
    from_two = run(_state, 2, stage, None)
    assert run(_state, 2, stage, from_two) == ["loaded", "loaded"]
    other_stage = run(_state, 2, 1 + stage % 3, from_two)
    assert all(f"stage {stage}" in message for message in other_stage)
