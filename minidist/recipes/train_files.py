"""The files of a training run in its folder (``--out``):

    checkpoint.npz    the full state dict ({name: array}, the unsplit model's names and dtype)
    checkpoint.json   {"step": the steps trained, "config": the flags, "history": {"train": [[step, loss]],
                      "val": [[step, loss]]}} — what --resume reads back (the optimizer's moments are not
                      kept: a resumed AdamW starts afresh)
    loss.png          training and validation loss against the step

Under mpiexec only rank 0 writes (minidist.cluster.mpi_rank).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from minidist.cluster.mpi_rank import is_quiet_rank
from minidist.sim.plots import write_png

WEIGHTS, META, FIGURE = "checkpoint.npz", "checkpoint.json", "loss.png"


def save_checkpoint(out: Path, state: dict, config: dict, step: int, history: dict) -> Path:
    """Write checkpoint.npz and checkpoint.json into ``out`` (created if missing); returns the .npz path."""
    out = Path(out)
    if is_quiet_rank():
        return out / WEIGHTS
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / WEIGHTS, **state)
    meta = {"step": step, "config": config, "history": history}
    (out / META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return out / WEIGHTS


def load_checkpoint(out: Path) -> tuple[dict, dict]:
    """(state dict, the .json's contents) of the checkpoint in ``out``. FileNotFoundError when there is
    none; ValueError when the two files do not belong together."""
    out = Path(out)
    for name in (WEIGHTS, META):
        if not (out / name).is_file():
            raise FileNotFoundError(f"no checkpoint to resume from: {out / name} does not exist")
    meta = json.loads((out / META).read_text(encoding="utf-8"))
    if not {"step", "config", "history"} <= set(meta):
        raise ValueError(f"{out / META} is not a checkpoint of `python -m minidist train`")
    with np.load(out / WEIGHTS) as arrays:
        state = {name: arrays[name] for name in arrays.files}
    return state, meta


def plot_losses(out: Path, history: dict, title: str, objective: str = "cross-entropy") -> Path:
    """loss.png in ``out``: the training objective per step (``objective`` names it) and the validation
    loss where it was measured, integer steps on the x axis, one legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    if history["train"]:
        steps, losses = zip(*history["train"])
        ax.plot(steps, losses, lw=0.9, label=f"training batch ({objective})")
    if history["val"]:
        steps, losses = zip(*history["val"])
        ax.plot(steps, losses, "o-", color="C3", ms=4, label="validation (held-out text)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="step", ylabel="loss (nats per character)", title=title)
    ax.legend()
    path = write_png(fig, Path(out) / FIGURE, dpi=90)
    plt.close(fig)
    return path
