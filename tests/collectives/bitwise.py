"""Bitwise comparison of a collective's result with the exact one, described for a student: which rank,
which chunk of the ring (np.array_split's rule), expected vs got — never raw bytes."""

import numpy as np

from minidist.collectives.pieces import split_offsets


def mismatch(got, want, rank: int, chunks: int = 1, what: str = "") -> str | None:
    """None when got equals want bit for bit; else one line saying where and how they differ."""
    got, want = np.asarray(got), np.asarray(want)
    where = f"{what}: rank {rank}" if what else f"rank {rank}"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{where}: expected shape {want.shape} {want.dtype}, got {got.shape} {got.dtype}"
    if got.tobytes() == want.tobytes():
        return None
    g, w = got.ravel(), want.ravel()
    bits = f"u{g.dtype.itemsize}" if g.dtype.kind in "fiu" else None
    differ = (g.view(bits) != w.view(bits)) if bits else (g != w)
    bad = np.flatnonzero(differ)
    i = int(bad[0])
    bounds = split_offsets(g.size, max(1, chunks))
    c = int(np.searchsorted(bounds, i, side="right") - 1)
    lo, hi = bounds[c], bounds[c + 1]
    chunk = f" (chunk {c} of {chunks}, elements {lo}:{hi})" if chunks > 1 else ""
    return (f"{where}: {bad.size} of {g.size} elements wrong; element {i}{chunk}: expected {w[i]!r}, "
            f"got {g[i]!r}; that chunk expected {w[lo:hi][:5].tolist()}, got {g[lo:hi][:5].tolist()}")
