"""Mixed-precision runs checkpoint their fp32 masters, the optimizer's state and the loss scaler: a float32
GPT on data 2 (FP16 with a dynamic scaler whose first 2 steps overflow, so its scale matters; FP16 masters
with stochastic rounding, its generator in the checkpoint) saved after 3 steps and resumed by a fresh
trainer ends bitwise equal to 6 uninterrupted steps; a plain trainer, or other formats, are refused before
the trainer is built."""

import re

import numpy as np
import pytest

from minidist.checkpoint import load, read_manifest, save
from minidist.cluster import run
from minidist.nn import GPT, CrossEntropyLoss
from minidist.optim import AdamW
from minidist.parallel import Mesh, parallelize
from minidist.precision import BF16, FP16, DynamicLossScaler

from .helpers import T, V, train

SETTINGS = {"dynamic": {"fmt": FP16},          # (its scaler: one per trainer, mixed_trainer makes it)
            "stochastic": {"fmt": FP16, "master_fmt": FP16, "update_rounding": "stochastic"}}


def mixed_trainer(comm, setting):
    mixed = dict(SETTINGS[setting]) if isinstance(setting, str) else setting
    if mixed and mixed.get("update_rounding") == "stochastic":
        mixed["rng"] = np.random.default_rng(1)
    elif setting == "dynamic":        # starts high: the first steps overflow and are skipped, s halves
        mixed["scaler"] = DynamicLossScaler(init_scale=2.0**18, growth_interval=2)
    model = GPT(V, T, 2, 8, 2, rng=np.random.default_rng(5), dtype=np.float32)
    return parallelize(model, Mesh(comm, data=comm.world_size), loss_fn=CrossEntropyLoss(),
                       optimizer=lambda ps: AdamW(ps, lr=1e-2), mixed=mixed)


def resumed(comm, root, setting):
    rng, whole = np.random.default_rng(9), mixed_trainer(comm, setting)
    train(whole, rng, 3)
    save(whole, root, 3, rngs={"batches": rng})
    train(whole, rng, 3)
    rng, again = np.random.default_rng(0), mixed_trainer(comm, setting)
    load(again, root, rngs={"batches": rng})
    train(again, rng, 3)
    return whole.full_state_dict(), again.full_state_dict()


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_a_mixed_precision_run_resumes_bitwise(tmp_path, setting):
    for whole, again in run(resumed, 2, str(tmp_path), setting, timeout=120):
        for name, value in whole.items():
            assert np.array_equal(again[name], value), name
    saved = read_manifest(tmp_path / "step-00000003")["mixed"]
    assert saved["steps_taken"] + saved["steps_skipped"] == 3 and saved["config"]["fmt"].startswith("Float")
    assert (saved["rng"] is not None) == (setting == "stochastic")
    if setting == "dynamic":                       # s backed off twice: a fresh scaler would skip again
        assert (saved["steps_skipped"], saved["scale"], saved["clean_steps"]) == (2, 2.0**16, 1)


def refused(comm, root, setting):
    trainer = mixed_trainer(comm, setting)
    try:
        load(trainer, root)
    except ValueError as e:
        return str(e), trainer.units is None          # refused before the trainer was built


def test_another_precision_is_refused(tmp_path):
    run(resumed, 2, str(tmp_path), "dynamic", timeout=120)
    for setting, message in ((None, "saved with mixed precision, this trainer runs without"),
                             ({"fmt": BF16}, "saved with mixed = .*this trainer has mixed")):
        for error, untouched in run(refused, 2, str(tmp_path), setting, timeout=60):
            assert untouched and re.search(message, error) and "manifest.json" in error, error
