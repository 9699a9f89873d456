"""Figures: where they go, how they are written, and the timelines the lessons and the demo share.

A committed figure must be the same bytes every time its lesson runs, or every run would change tracked
files (and a student pulling course updates would meet conflicts). So ``save_figure`` writes PNGs with
fixed metadata (no "Software" entry naming the matplotlib version; PNGs carry no date), and lessons draw
simulated clocks, not measured wall-clock times, in the figures they commit. Figures go to the
repository's figures/ folder, or to the folder named by the environment variable MINIDIST_FIGURES (the
tests point it at a temporary folder).

In Jupyter or IPython every figure written here is also shown inline (``show_inline``): the lessons force
the Agg backend and close their figures, as scripts should, and still show them as notebooks.

matplotlib is imported inside the functions only: importing minidist never loads it.
"""

from __future__ import annotations

import os
from pathlib import Path

from minidist.cluster.mpi_rank import is_quiet_rank

ENV_VAR = "MINIDIST_FIGURES"
TIMELINE_COLORS = {"send": "tab:blue", "recv": "tab:orange", "compute": "tab:green", "barrier": "tab:gray"}


def figures_dir() -> Path:
    """The folder figures are written to (created if missing): $MINIDIST_FIGURES, else <repo>/figures."""
    override = os.environ.get(ENV_VAR)
    folder = Path(override) if override else Path(__file__).resolve().parents[2] / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_png(fig, path: str | Path, dpi: int = 110) -> Path:
    """Save ``fig`` as a PNG at ``path`` with fixed metadata: the same figure gives the same bytes.
    Under mpiexec only rank 0 writes (the other processes drew the same figure): elsewhere nothing happens.
    Inside a notebook the PNG is shown inline as well."""
    path = Path(path)
    if is_quiet_rank():
        return path
    fig.savefig(path, dpi=dpi, format="png", metadata={"Software": None})
    show_inline(path)
    return path


def show_inline(path: Path) -> bool:
    """Display the PNG at ``path`` in the running Jupyter/IPython kernel, if any; True if shown."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None or not hasattr(shell, "kernel"):     # a script, or a terminal IPython: files only
        return False
    from IPython.display import Image, display

    display(Image(data=Path(path).read_bytes(), format="png"))
    return True


def save_figure(fig, name: str, dpi: int = 110) -> Path:
    """Save ``fig`` as figures_dir()/name (a PNG file name such as "05_schedule_ring.png");
    returns the path."""
    if Path(name).name != name or not name.endswith(".png"):
        raise ValueError(f"expected a PNG file name such as '05_ring.png', got {name!r}")
    return write_png(fig, figures_dir() / name, dpi)


def plot_timeline(trace, ax=None, path: str | Path | None = None, title: str = "simulated timeline"):
    """Gantt chart of a cluster Trace: one row per rank, one bar per span, coloured by kind.

    trace: a minidist.cluster Trace (``.spans`` with rank, start, end, kind; ``.world_size``).
    Times in microseconds. Returns the matplotlib Axes; writes a PNG (fixed metadata) when ``path`` is given.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * trace.world_size))
    for s in trace.spans:
        if s.end > s.start:
            ax.barh(s.rank, (s.end - s.start) * 1e6, left=s.start * 1e6, height=0.6,
                    color=TIMELINE_COLORS.get(s.kind, "tab:purple"), edgecolor="black", linewidth=0.3)
    for kind, color in TIMELINE_COLORS.items():
        if any(s.kind == kind for s in trace.spans):
            ax.barh([0], [0], color=color, label=kind)   # legend entry only
    ax.set_yticks(range(trace.world_size), [f"rank {r}" for r in range(trace.world_size)])
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (us)")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    if path is not None:
        ax.figure.tight_layout()
        write_png(ax.figure, path, dpi=120)
    return ax


def plot_overlap(trace, compute_spans: list, ax=None, path: str | Path | None = None,
                 title: str = "data-parallel step: compute and communication streams"):
    """Two rows per rank: its compute stream (``compute_spans[rank]``, from DataParallel.clock.spans)
    and its communication stream (the sends and receives of ``trace``). Times in microseconds from the
    first compute span (pass the spans of one step to see one step). Returns the Axes."""
    import matplotlib.pyplot as plt

    ranks = len(compute_spans)
    t0 = min((s.start for spans in compute_spans for s in spans), default=0.0)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.6 + 0.5 * 2 * ranks))
    colors = {"forward": "tab:green", "backward": "tab:olive", "send": "tab:blue", "recv": "tab:orange"}
    labels = []
    for rank in range(ranks):
        communication = [s for s in trace.rank_spans(rank) if s.kind in ("send", "recv")]
        labels += [f"rank {rank} compute", f"rank {rank} comm"]
        for spans, row in ((compute_spans[rank], 2 * rank), (communication, 2 * rank + 1)):
            for s in spans:
                if s.end > s.start and s.end > t0:
                    kind = s.label.split()[0] if s.kind == "compute" else s.kind
                    ax.barh(row, (s.end - s.start) * 1e6, left=(s.start - t0) * 1e6, height=0.7,
                            color=colors.get(kind, "tab:purple"), edgecolor="black", linewidth=0.2)
    for kind, color in colors.items():
        ax.barh([0], [0], color=color, label=kind)
    ax.set_yticks(range(2 * ranks), labels)
    ax.invert_yaxis()
    ax.set_xlim(left=0)
    ax.set_xlabel("simulated time since the step began (us)")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    if path is not None:
        ax.figure.tight_layout()
        write_png(ax.figure, path, dpi=110)
    return ax
