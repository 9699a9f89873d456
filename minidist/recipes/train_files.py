"""The files of a training run in its folder (``--out``):

    checkpoints/step-N/   minidist.checkpoint's checkpoint after step N (every --save-every steps and at the
                          end): each rank's shard of the weights and AdamW's moments, and the manifest, whose
                          "extra" is {"config": the flags, "history": {"train": [[step, loss]], "val":
                          [[step, loss]]}} — what --resume and --restarts go on from (onto any layout)
    loss.png              training and validation loss against the step

Under mpiexec only rank 0 writes the figure (minidist.cluster.mpi_rank).
"""

from __future__ import annotations

from pathlib import Path

from minidist.checkpoint import held_by, latest, load, read_manifest
from minidist.cluster.mpi_rank import is_quiet_rank
from minidist.sim.plots import write_png

CHECKPOINTS, FIGURE = "checkpoints", "loss.png"


def saved_run(out: Path) -> tuple[int, dict, dict]:
    """(step, config, history) of the newest checkpoint under ``out``. FileNotFoundError when there is none;
    ValueError when it is not one of `python -m minidist train`."""
    directory = latest(Path(out) / CHECKPOINTS)
    if directory is None:
        raise FileNotFoundError(f"no checkpoint to resume from: {Path(out) / CHECKPOINTS} holds no "
                                "complete step-N")
    manifest = read_manifest(directory)
    if not {"config", "history"} <= set(manifest.get("extra", {})):
        raise ValueError(f"{directory} is not a checkpoint of `python -m minidist train`")
    return manifest["step"], manifest["extra"]["config"], manifest["extra"]["history"]


def load_unsplit(model, optimizer, directory: Path) -> dict:
    """Load the checkpoint in ``directory`` (any layout's) into the unsplit ``model`` and its ``optimizer``,
    in this process; returns load's {"step", "extra", "directory"}."""
    return load(held_by(None, model, optimizer), directory)


def plot_losses(out: Path, history: dict, title: str, objective: str = "cross-entropy") -> Path:
    """loss.png in ``out``: the training objective per step (``objective`` names it) and the validation
    loss where it was measured, integer steps on the x axis, one legend. (Under mpiexec: rank 0 only.)"""
    if is_quiet_rank():
        return Path(out) / FIGURE
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
