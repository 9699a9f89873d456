"""Diagnosing tile_schedule in its own terms: which tile, at which tick of the array's run (the i-th tile
it loads), is not a k-grid tile inside the K × M weight, which weight W[i, j] two tiles cover, and which
weight no tile covers (with the tile that should hold it).

The rule, written out here: the tiles are (rows a:min(a + k, K), columns b:min(b + k, M)) for a and b
multiples of k, ⌈K/k⌉·⌈M/k⌉ of them in any order (the closed-form cycle count assumes full k × k tiles
wherever they fit); the array runs tile i at tick i, from cycle i·(n + 2(k − 1)) when streaming n rows.
"""

import math

import numpy as np

CASES = ((5, 3, 2), (4, 4, 2), (7, 9, 3), (3, 10, 16), (1, 1, 1), (2, 5, 1))     # (K, M, k)


def span(part: slice) -> str:
    return f"{part.start}:{part.stop}"


def grid_tile_off(tile, K: int, M: int, k: int) -> str | None:
    """Why a (rows, columns) pair is not a tile of the k-grid inside K × M, or None."""
    if not (isinstance(tile, tuple) and len(tile) == 2 and all(isinstance(s, slice) for s in tile)):
        return f"is {tile!r}, not a (rows, columns) pair of slices"
    for part, name, size in ((tile[0], "rows", K), (tile[1], "columns", M)):
        if part.step not in (None, 1) or not all(isinstance(end, (int, np.integer))
                                                 for end in (part.start, part.stop)):
            return f"has {name} {part}: expected a slice a:b with step 1"
        if not 0 <= part.start < part.stop <= size:
            return f"has {name} {span(part)}, not inside 0:{size}"
        if part.start % k:
            return f"has {name} {span(part)}, starting off the k-grid (a multiple of k = {k})"
        if part.stop != min(part.start + k, size):
            return (f"has {name} {span(part)}; from {part.start} they should be {part.start}:"
                    f"{min(part.start + k, size)} = min(a + k, {size}) (a full tile where it fits, clipped "
                    f"at the edge)")
    return None


def diagnose_tile_schedule(tile_schedule) -> str | None:
    """The first tile (by tick) or weight that tile_schedule(K, M, k) gets wrong, for a few cases."""
    for K, M, k in CASES:
        what = f"tile_schedule(K={K}, M={M}, k={k})"
        tiles = list(tile_schedule(K, M, k))
        for tick, tile in enumerate(tiles):
            wrong = grid_tile_off(tile, K, M, k)
            if wrong:
                return f"{what}: tile {tick} (run at tick {tick}) {wrong}"
        owners: dict[tuple[int, int], list[int]] = {index: [] for index in np.ndindex(K, M)}
        for tick, (rows, cols) in enumerate(tiles):
            for index in np.ndindex(rows.stop - rows.start, cols.stop - cols.start):
                owners[rows.start + index[0], cols.start + index[1]].append(tick)
        for (i, j), ticks in owners.items():
            if len(ticks) > 1:
                held = "; ".join(f"tick {t}: rows {span(tiles[t][0])}, columns {span(tiles[t][1])}"
                                 for t in ticks)
                return (f"{what}: weight W[{i}, {j}] is covered by {len(ticks)} tiles ({held}); each weight "
                        f"is loaded once")
            if not ticks:
                a, b = i - i % k, j - j % k
                return (f"{what}: weight W[{i}, {j}] is in no tile: the tile of rows {a}:{min(a + k, K)}, "
                        f"columns {b}:{min(b + k, M)} is missing ({len(tiles)} tiles; ⌈K/k⌉·⌈M/k⌉ = "
                        f"{math.ceil(K / k) * math.ceil(M / k)})")
    return None
