"""Distributed checkpoints of parallelized runs, and runs that survive a lost rank.

    manifest.py    a checkpoint's directory, its manifest (mesh, step, model, optimizer, checksums)
    shards.py      what each rank saves (its elements, by label) and how any mesh takes them back
    save_load.py   save(trainer, root, step, ...) / load(trainer, root, ...): atomic, checked
    mixed.py       what a mixed-precision run adds: the loss scaler's state, the rounding generator's
    held.py        held_by(comm, model, optimizer): the same for DataParallel, the Pipeline, one process
    resilient.py   run_resilient(fn, world_size, *args, root, restarts): restart from the last checkpoint

    from minidist.checkpoint import save, load
    save(trainer, "runs/ckpt", step, rngs={"batches": rng})      # every rank, every k steps
    load(trainer, "runs/ckpt", rngs={"batches": rng})            # any mesh: re-split, exact
"""

from .held import HeldParameters, held_by
from .manifest import latest, read_manifest
from .resilient import Failure, ResilientRun, last_step, resume, run_resilient
from .save_load import load, save

__all__ = ["Failure", "HeldParameters", "ResilientRun", "held_by", "last_step", "latest", "load",
           "read_manifest", "resume", "run_resilient", "save"]
