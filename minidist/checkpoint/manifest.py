"""A checkpoint's manifest: what was saved, by whom, and how to know it is whole.

A checkpoint is a directory ``ROOT/step-NNNNNNNN/`` holding one ``rank-RRRRR.npz`` per rank (shards.py)
and ``manifest.json``:

    step        the steps trained           mesh      {axis: size} of the mesh that saved it
    model       [[name, shape, dtype]] of model.named_parameters() (the model's fingerprint)
    optimizer   the optimizer's class, lr, hyper-parameters, step counter, state names
    seq_len     the sequence length the split was built for
    files       {file name: {"bytes": size, "sha256": digest}} of every rank's file
    random      {name: a numpy Generator's bit_generator.state}; extra: the caller's
    mixed       None, or a mixed-precision run's loss scaler, counters and rounding generator (mixed.py)

The manifest is written last, inside a temporary directory renamed into place (save_load.py): a directory
named step-N is complete, and the newest one is the run's last checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST, PREFIX = "manifest.json", "step-"


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step:08d}"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.npz"


def fingerprint(trainer) -> list[list]:
    """[[name, shape, dtype]] of the unsplit model's parameters, in order: what a checkpoint must match
    (once built, the names the Trainer labelled: the transforms rename the split modules)."""
    if trainer.units is None:
        return [[name, list(p.shape), str(p.data.dtype)] for name, p in trainer.model.named_parameters()]
    return [[name, list(value.shape), str(value.dtype)] for name, _, value in trainer.named]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: Path, content: dict) -> None:
    """Write path and flush it to the disk (fsync) before returning."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def read_manifest(directory: Path) -> dict:
    """The manifest of the checkpoint in ``directory``; ValueError naming the file when it is missing or
    not one."""
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no manifest: {directory} is not a complete checkpoint") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a checkpoint manifest ({e})") from None
    missing = {"step", "mesh", "model", "optimizer", "seq_len", "files"} - set(manifest)
    if missing:
        raise ValueError(f"{path}: not a checkpoint manifest (no {', '.join(sorted(missing))})")
    return manifest


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint under root (the highest step-N with a manifest), or None."""
    root = Path(root)
    done = sorted(p for p in root.glob(f"{PREFIX}*") if (p / MANIFEST).exists()) if root.is_dir() else []
    return done[-1] if done else None


def check_files(directory: Path, manifest: dict) -> None:
    """ValueError naming the first rank file that is missing, of another size, or whose checksum differs."""
    for name, expected in manifest["files"].items():
        path = Path(directory) / name
        if not path.exists():
            raise ValueError(f"{path}: this rank's file is missing from the checkpoint")
        if path.stat().st_size != expected["bytes"]:
            raise ValueError(f"{path}: {path.stat().st_size} bytes, the manifest says {expected['bytes']} "
                             "(truncated?)")
        if sha256(path) != expected["sha256"]:
            raise ValueError(f"{path}: checksum (sha256) differs from the manifest's: the file is corrupted")


def check_model(directory: Path, manifest: dict, trainer) -> None:
    """ValueError naming the manifest when the checkpoint is of another model (names, shapes, dtypes)."""
    mine = fingerprint(trainer)
    if manifest["model"] != mine:
        first = next((s, m) for s, m in zip(manifest["model"] + [None] * len(mine), mine + [None] *
                                             len(manifest["model"])) if s != m)
        raise ValueError(f"{Path(directory) / MANIFEST}: a checkpoint of another model: it has parameter "
                         f"{first[0]}, this model {first[1]}")
