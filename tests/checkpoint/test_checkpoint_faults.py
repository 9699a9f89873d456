"""Bad checkpoints are refused, naming the file, before the model or a generator changes; a save killed
(SIGKILL) before its manifest leaves the previous checkpoint the newest and loadable; nothing is left in
/dev/shm. Three cluster runs of 2 ranks."""

import os
import re
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from minidist.checkpoint import latest, load, save
from minidist.checkpoint import save_load as save_load_module
from minidist.cluster import ClusterError, run
from minidist.cluster.launcher import last_resource_names
from minidist.nn import GPT, CrossEntropyLoss
from minidist.optim import SGD
from minidist.parallel import Mesh, parallelize

from .helpers import V, build, one_process, train, trainer_on


def save_twice_killed_in_second(comm, root):
    """Save after 2 steps; in the save after 4, rank 0 is killed before it writes the manifest."""
    rng = np.random.default_rng(9)
    trainer = trainer_on(comm, {"tensor": 2})
    train(trainer, rng, 2)
    save(trainer, root, 2, rngs={"batches": rng})
    train(trainer, rng, 2)
    if comm.rank == 0:
        def killed(*args):
            os.kill(os.getpid(), signal.SIGKILL)
        save_load_module.write_json = killed
    save(trainer, root, 4, rngs={"batches": rng})


def load_and_report(comm, root):
    trainer, rng = trainer_on(comm, {"data": 2}), np.random.default_rng(0)
    return load(trainer, root, rngs={"batches": rng})["step"], trainer.full_state_dict()


@pytest.fixture
def saved(tmp_path_factory):
    """A checkpoint at step 2 and a save at step 4 killed mid-way: (root, the step-2 directory).
    Per test, not per module: the training reaches exercises, and a student copy must see each test do so."""
    root = tmp_path_factory.mktemp("ckpt")
    with pytest.raises(ClusterError, match="rank 0"):
        run(save_twice_killed_in_second, 2, str(root), timeout=120)
    assert not [n for n in last_resource_names() if os.path.exists(f"/dev/shm/{n.lstrip('/')}")]
    return root, latest(root)


def test_a_save_killed_before_its_manifest_leaves_the_previous_checkpoint_loadable(saved):
    root, previous = saved
    assert previous.name == "step-00000002" and (root / ".tmp-step-00000004").is_dir()
    step, state = run(load_and_report, 2, str(root), timeout=120)[0]
    reference = one_process(2)
    assert step == 2
    for name, value in reference.items():
        np.testing.assert_allclose(state[name], value, rtol=0, atol=1e-9)


def spoiled(tmp: Path, source: Path, how: str) -> Path:
    """A copy of the checkpoint directory, spoiled as ``how`` says."""
    target = tmp / how
    shutil.copytree(source, target)
    shard = target / "rank-00001.npz"
    if how == "truncated":
        shard.write_bytes(shard.read_bytes()[:-100])
    elif how == "corrupted":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(data)
    elif how == "missing":
        shard.unlink()
    return target


def try_loads(comm, cases):
    """Each case: (directory, which trainer) -> the refusal's message, and whether anything changed."""
    out = []
    for directory, kind in cases:
        if kind == "other model":
            model = GPT(V, 8, 2, 16, 2, rng=np.random.default_rng(5), dtype=np.float64)
            trainer = parallelize(model, Mesh(comm, data=2), loss_fn=CrossEntropyLoss(),
                                  optimizer=lambda ps: SGD(ps, lr=0.1))
        elif kind == "sgd":
            trainer = parallelize(build(), Mesh(comm, data=2), loss_fn=CrossEntropyLoss(),
                                  optimizer=lambda ps: SGD(ps, lr=0.1))
        elif kind == "context":
            trainer = trainer_on(comm, {"context": 2})
        else:
            trainer = trainer_on(comm, {"data": 2})
        before = trainer.full_state_dict()
        rng = np.random.default_rng(0)
        state = rng.bit_generator.state
        try:
            load(trainer, directory, rngs={"batches": rng})
            message = None
        except ValueError as e:
            message = str(e)
        after = trainer.full_state_dict()      # (the unsplit state, also after a refused load built it)
        same = all(np.array_equal(before[k], after[k]) for k in before)
        unchanged = same and rng.bit_generator.state == state
        out.append((message, unchanged))
    return out


def test_each_bad_checkpoint_is_refused_naming_the_file(saved, tmp_path):
    root, good = saved
    seq6 = tmp_path / "seq6"          # saved for sequences of 6: context 2 needs 4 | T
    cases = {
        "truncated": (str(spoiled(tmp_path, good, "truncated")), "plain", r"rank-00001.npz: .* bytes"),
        "corrupted": (str(spoiled(tmp_path, good, "corrupted")), "plain", r"rank-00001.npz: checksum"),
        "missing": (str(spoiled(tmp_path, good, "missing")), "plain", r"rank-00001.npz: .*missing"),
        "other model": (str(good), "other model", r"manifest.json: a checkpoint of another model"),
        "optimizer": (str(good), "sgd", r"manifest.json: saved with AdamW .* optimizer is SGD"),
        "no checkpoint": (str(tmp_path / "nothing"), "plain", r"nothing: no complete checkpoint"),
    }
    spoiled(tmp_path, good, "seq6")
    manifest = (seq6 / "manifest.json").read_text().replace('"seq_len": 8', '"seq_len": 6')
    (seq6 / "manifest.json").write_text(manifest)
    cases["mesh"] = (str(seq6), "context", r"manifest.json: sequences of 6 do not split into 2·context")
    results = run(try_loads, 2, [c[:2] for c in cases.values()], timeout=120)
    assert not [n for n in last_resource_names() if os.path.exists(f"/dev/shm/{n.lstrip('/')}")]
    for rank in range(2):
        for (name, (_, _, pattern)), (message, unchanged) in zip(cases.items(), results[rank], strict=True):
            assert message is not None, f"{name}: loaded"
            assert re.search(pattern, message), (name, message)
            assert unchanged, f"{name}: the refused load changed the model or the generator"


def bad_saves(comm, root):
    trainer, messages = trainer_on(comm, {"data": 1}), []
    for step in (1, -1):
        try:
            save(trainer, root, step)
        except ValueError as e:
            messages.append(str(e))
        train(trainer, np.random.default_rng(0), 1)
    return messages


def test_bad_saves_are_refused_before_anything_is_written(tmp_path):
    unbuilt, negative = run(bad_saves, 1, str(tmp_path / "ckpt"), timeout=60)[0]
    assert "save: the trainer is not built yet" in unbuilt
    assert "save: step must be an integer >= 0, got -1" in negative
    assert not (tmp_path / "ckpt").exists()
