"""The figure of the planner's check: predicted against run step time and peak memory, per rank.

``points`` maps each layout (``check.GridLayout``) to its ranks' (predicted seconds, measured seconds,
predicted peak bytes, measured peak bytes), "measured" on the simulated cluster: its clock's step time
and its memory ledger's peak, not a wall clock. Log axes, so the small ranks' kilobytes are seen too; a
marker's shape is the schedule, filled when the layout has a context group, with a black dot inside when
it has an expert group (a Switch model); on the gray diagonal the prediction is exact.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np


def plot_check(points: dict) -> plt.Figure:
    """Two log-log panels (time in µs, memory in kB) of every rank of every layout; returns the figure."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    kinds = {"1f1b": ("tab:blue", "s", 70), "no pipeline": ("tab:gray", "o", 30),   # 1F1B around ZB-H1
             "zb-h1": ("tab:green", "^", 25), "interleaved": ("tab:orange", "D", 30),
             "chimera": ("tab:red", "v", 35)}
    for lay, pts in sorted(points.items(), key=lambda item: list(kinds).index(
            "no pipeline" if item[0].pipe == 1 else item[0].schedule)):
        pts = np.array(pts)
        color, marker, size = kinds["no pipeline" if lay.pipe == 1 else lay.schedule]
        style = {"marker": marker, "s": size, "linewidths": 1, "edgecolors": color,
                 "facecolors": color if lay.context > 1 else "none"}          # filled: a context group
        axes[0].scatter(pts[:, 0] * 1e6, pts[:, 1] * 1e6, **style)
        axes[1].scatter(pts[:, 2] / 1e3, pts[:, 3] / 1e3, **style)
        if lay.expert > 1:                                            # a dot inside: a Switch model
            axes[0].scatter(pts[:, 0] * 1e6, pts[:, 1] * 1e6, marker=".", s=6, color="black")
            axes[1].scatter(pts[:, 2] / 1e3, pts[:, 3] / 1e3, marker=".", s=6, color="black")
    panels = ((axes[0], "µs", "step time per rank", "the run's simulated clock", 1, (70, 100, 200, 400, 700)),
              (axes[1], "kB", "peak memory per rank", "the run's memory ledger", 3,
               (2, 5, 10, 20, 50, 100, 200)))
    for ax, unit, what, run, col, ticks in panels:
        values = np.array([v[col] for pts in points.values() for v in pts]) * (1e6 if col == 1 else 1e-3)
        lo, hi = values.min() / 1.2, values.max() * 1.2          # log axes: the small ranks' kB are seen too
        ax.plot([lo, hi], [lo, hi], color="gray", lw=1, zorder=0)
        ax.set(xlim=(lo, hi), ylim=(lo, hi), xscale="log", yscale="log", xlabel=f"predicted ({unit})",
               ylabel=f"{run} ({unit})", title=f"{what}: predicted vs simulated run")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(plt.FixedLocator(ticks))
            axis.set_major_formatter(plt.FixedFormatter([str(t) for t in ticks]))
            axis.set_minor_formatter(plt.NullFormatter())
    handles = [plt.Line2D([], [], ls="", marker=m, markersize=np.sqrt(z), color=c, markerfacecolor="none",
                          label=k) for k, (c, m, z) in kinds.items()]
    handles.append(plt.Line2D([], [], ls="", marker="o", color="black", label="filled: context 2 or 4"))
    if any(lay.expert > 1 for lay in points):
        handles.append(plt.Line2D([], [], ls="", marker=".", color="black", label="dot: Switch, expert 2"))
    axes[0].legend(handles=handles, fontsize=7, title=f"{len(points)} layouts", title_fontsize=7)
    fig.tight_layout()
    return fig
