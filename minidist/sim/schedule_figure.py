"""The figure of a collective's schedule (lesson 05): one row per rank, one arrow per message.

An arrow goes from the sender (at step k) to the receiver (at step k + 1), labelled with the chunk it
carries: c0..c{P-1} the P pieces of the array, "all" the whole array, x1 rank 1's own input (naive). Red
arrows are added into the receiver's copy, blue ones overwrite it. ``plan`` is a
``minidist.sim.collective_rounds.Schedule``.
"""

from __future__ import annotations

import numpy as np


def chunk_label(plan, t) -> str:
    """The label of transfer t of plan: x<src>, all, c<i> or c<i>-<j>."""
    if plan.own_input:  # naive: each message is the sender's own input x_r
        return f"x{t.src}"
    if plan.parts == 1 or (t.lo, t.hi) == (0, plan.parts):
        return "all"
    return f"c{t.lo}" if t.hi - t.lo == 1 else f"c{t.lo}-{t.hi - 1}"


def draw_schedule(plan):
    """A matplotlib Figure of plan's steps (the caller saves and closes it)."""
    import matplotlib.pyplot as plt

    p, steps = plan.world_size, plan.steps
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 + 1.5 * len(steps)), 1.0 + 0.75 * p))
    for k, step in enumerate(steps):
        for t in step:
            color = "tab:red" if t.reduce else "tab:blue"
            ax.annotate("", xy=(k + 1, t.dst), xytext=(k, t.src),
                        arrowprops={"arrowstyle": "-|>", "color": color, "lw": 1.4,
                                    "shrinkA": 7, "shrinkB": 7})
            f = 0.27 if t.dst > t.src else 0.73  # label near the tail of down-arrows, the head of up-arrows
            ax.text(k + f, t.src + f * (t.dst - t.src), chunk_label(plan, t), color=color, fontsize=8,
                    ha="center", va="center", zorder=4,
                    bbox={"boxstyle": "round,pad=0.12", "fc": "white", "ec": "none", "alpha": 0.9})
    for k in range(len(steps) + 1):
        ax.scatter([k] * p, range(p), s=90, color="white", edgecolor="black", zorder=3)
    ax.set_xticks(np.arange(len(steps)) + 0.5, [f"step {k + 1}" for k in range(len(steps))])
    ax.tick_params(axis="x", length=0)
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set(ylim=(p - 0.5, -0.6), xlim=(-0.4, len(steps) + 0.4))
    ax.set_title(f"{plan.algorithm} allreduce, P = {p}\n"
                 "red: added into the receiver's copy, blue: overwrites it", fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig
