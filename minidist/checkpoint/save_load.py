"""save(trainer, root, step) and load(trainer, root): a parallelized run's checkpoint, one file per rank.

save, on every rank of the mesh (a collective):
    1. rank 0 makes ROOT/.tmp-step-N/ (removing what a crashed save left)          barrier
    2. each rank writes its shard rank-R.npz (shards.py) and fsyncs it             barrier
    3. rank 0 hashes the files, writes manifest.json (fsync), renames the directory to ROOT/step-N and
       fsyncs ROOT                                                                  barrier
A crash before the rename leaves only a .tmp directory: the previous step-M stays the newest complete one.

load, on every rank of the (possibly different) mesh: every check first — the manifest, the model's
fingerprint, each rank file's size and sha256, the shards' labels covering the model, the optimizer, the
mesh — then the trainer is built (prepare) and each rank takes its elements (shards.take_back).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from minidist.sim.compute import charge_seconds

from .manifest import (
    MANIFEST,
    PREFIX,
    check_files,
    check_model,
    fingerprint,
    latest,
    rank_file,
    read_manifest,
    sha256,
    step_dir,
    write_json,
)
from .mixed import check_mixed, mixed_state, restore_mixed
from .shards import assemble, rank_arrays, take_back


def save(trainer, root, step: int, *, rngs: dict | None = None, extra: dict | None = None,
         loader=None, disk_bytes_per_second: float | None = None) -> Path:
    """Write the checkpoint of ``trainer`` after ``step`` steps to ROOT/step-N (module docstring); returns
    its path. rngs: {name: numpy Generator} whose states are kept; extra: JSON-able caller state (e.g. the
    data loader's position). loader: this rank's data loader (anything with state_dict() -> JSON, e.g.
    minidist.data.Loader): its state goes into this rank's file. disk_bytes_per_second: when given, the
    simulated clock is charged each rank's write, bytes / bandwidth (the barriers are charged anyway).
    Collective: every rank of trainer.mesh calls it."""
    if trainer.units is None:
        raise ValueError("save: the trainer is not built yet (call it after a step or trainer.prepare)")
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"save: step must be an integer >= 0, got {step!r}")
    arrays = rank_arrays(trainer)
    if loader is not None:
        arrays[LOADER] = np.array(json.dumps(loader_state(loader)))
    comm, root = trainer.mesh.comm, Path(root)
    final, temporary = step_dir(root, step), root / f".tmp-{PREFIX}{step:08d}"
    if comm.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(f".tmp-{PREFIX}*"):
            shutil.rmtree(stale)
        temporary.mkdir()
    comm.barrier()
    with open(temporary / rank_file(comm.rank), "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
        if disk_bytes_per_second:
            charge_seconds(comm, f.tell() / disk_bytes_per_second, "checkpoint write")
    comm.barrier()
    if comm.rank == 0:
        write_json(temporary / MANIFEST, manifest_of(trainer, step, temporary, rngs or {}, extra or {}))
        sync_directory(temporary)
        if final.exists():                     # the same step saved again: the new one replaces it
            shutil.rmtree(final)
        os.rename(temporary, final)
        sync_directory(root)
    comm.barrier()
    return final


LOADER = "loader_state"         # the key of a rank's loader state (JSON text) in its file


def loader_state(loader) -> dict:
    for name in ("state_dict", "load_state_dict"):
        if not callable(getattr(loader, name, None)):
            raise TypeError(f"loader must have .{name}() (e.g. a minidist.data.Loader), got "
                            f"{type(loader).__name__}")
    return loader.state_dict()


def manifest_of(trainer, step: int, directory: Path, rngs: dict, extra: dict) -> dict:
    optimizer = trainer.optimizer
    names = [f"{rank_file(r)}" for r in range(trainer.mesh.comm.world_size)]
    return {"step": step, "mesh": dict(trainer.mesh.sizes), "zero": trainer.zero,
            "model": fingerprint(trainer), "seq_len": trainer.seq_len,
            "optimizer": {"class": type(optimizer).__name__, "lr": optimizer.lr,
                          "step_count": optimizer.step_count, "state_names": list(optimizer.state[0])},
            "files": {n: {"bytes": (directory / n).stat().st_size, "sha256": sha256(directory / n)}
                      for n in names},
            "random": {name: g.bit_generator.state for name, g in rngs.items()}, "extra": extra,
            "mixed": mixed_state(trainer)}


def sync_directory(path: Path) -> None:
    """fsync a directory, so the names in it (a rename) are on the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(trainer, root, *, rngs: dict | None = None, loader=None) -> dict:
    """Resume ``trainer`` (built by parallelize on this model, any mesh) from ROOT's newest complete
    checkpoint, or from the checkpoint directory ROOT itself. rngs: {name: Generator} given the saved
    states in place; loader: given its state from this rank's file (load_state_dict). Returns {"step",
    "extra", "directory"}. ValueError naming the file at fault, raised
    before the model, the optimizer or a generator changes. Collective: every rank of the mesh calls it."""
    root = Path(root)
    directory = root if (root / MANIFEST).exists() else latest(root)
    if directory is None:
        raise ValueError(f"{root}: no complete checkpoint (no {PREFIX}N/{MANIFEST}) to load")
    manifest = read_manifest(directory)
    check_model(directory, manifest, trainer)
    check_files(directory, manifest)
    check_mesh(directory, manifest, trainer)
    check_mixed(directory, manifest, trainer)
    for name in rngs or {}:
        if name not in manifest.get("random", {}):
            raise ValueError(f"{directory / MANIFEST}: no random state named {name!r} was saved "
                             f"(it has {sorted(manifest.get('random', {}))})")
    files = {}
    for name in manifest["files"]:
        with np.load(directory / name, allow_pickle=False) as arrays:
            files[str(directory / name)] = dict(arrays)
    if loader is not None:
        loader_state(loader)
        mine = files.get(str(directory / rank_file(trainer.mesh.comm.rank)), {})
        if LOADER not in mine:
            raise ValueError(f"{directory / rank_file(trainer.mesh.comm.rank)}: no data loader state in "
                             "this rank's file (saved without loader=, or by fewer ranks)")
    total = sum(int(np.prod(shape)) for _, shape, _ in manifest["model"])
    dtype = np.result_type(*[dtype for _, _, dtype in manifest["model"]])
    saved = manifest["optimizer"]
    flat = assemble(files, total, dtype, saved["state_names"])
    trainer.prepare(manifest["seq_len"])
    optimizer = trainer.optimizer
    if type(optimizer).__name__ != saved["class"] or list(optimizer.state[0]) != saved["state_names"]:
        raise ValueError(f"{directory / MANIFEST}: saved with {saved['class']} (state "
                         f"{saved['state_names']}), this trainer's optimizer is {type(optimizer).__name__}")
    if loader is not None:
        loader.load_state_dict(json.loads(str(mine[LOADER])))   # checks it first; the last refusal
    take_back(trainer, flat, saved["step_count"])
    restore_mixed(trainer, manifest.get("mixed"))
    optimizer.lr = saved["lr"]
    for name, g in (rngs or {}).items():
        g.bit_generator.state = manifest["random"][name]
    return {"step": manifest["step"], "extra": manifest.get("extra", {}), "directory": directory}


def check_mesh(directory: Path, manifest: dict, trainer) -> None:
    """ValueError naming the manifest when this trainer's mesh cannot take the checkpoint's sequences."""
    seq_len, s = manifest["seq_len"], trainer.mesh.sizes
    where = directory / MANIFEST
    if trainer.units is not None and trainer.seq_len not in (None, seq_len):    # (None: held whole)
        raise ValueError(f"{where}: saved for sequences of {seq_len}, this trainer was built for "
                         f"{trainer.seq_len}")
    if s["context"] > 1 and seq_len % (2 * s["context"]):
        raise ValueError(f"{where}: sequences of {seq_len} do not split into 2·context = "
                         f"{2 * s['context']} zigzag chunks on this mesh")
