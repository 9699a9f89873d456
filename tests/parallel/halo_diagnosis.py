"""Diagnosing exchange_halo (the forward halo exchange of a spatially split layer) in its own terms:
which rank's window, which side of its own block (the halo above, below, left, right, a corner, or its
own rows), which global row and column, and whose element it holds instead.

Input element (R, C) holds 64·R + C + 1, so a window element names the global row and column it came
from, and 0 says it was never filled. Each rank's window must equal x[window rows, window columns]; then
its bytes sent must equal the plan's halo_bytes (the formula in partition.py), no more.
"""

import numpy as np

import minidist.parallel.spatial.comm as halo_comm
from minidist.cluster import ClusterError, run
from minidist.parallel.spatial.partition import HaloPlan

#: (input H × W, kernel, stride, padding, grid): 3 × 3 with padding on a 2 × 2 grid (corners), a
#: kernel 5 on 3 row pieces of 2, 1, 1 (halos past the neighbour: hops ±2), stride 2 on 3 column pieces
CASES = (((6, 6), 3, 1, 1, (2, 2)), ((4, 3), 5, 1, 2, (3, 1)), ((4, 7), 3, 2, 1, (1, 3)))


def marked(hw: tuple[int, int]) -> np.ndarray:
    return (64 * np.arange(hw[0])[:, None] + np.arange(hw[1]) + 1.0)[None, None]


def halo_trace(comm, case):
    hw, kernel, stride, padding, grid = case
    plan = HaloPlan.build(hw, kernel, stride, padding, grid)
    (own_r, own_c) = plan.own_block(comm.rank)
    x_local = np.ascontiguousarray(marked(hw)[:, :, own_r[0]:own_r[1], own_c[0]:own_c[1]])
    before = comm.stats.bytes_sent
    window = halo_comm.exchange_halo(comm, x_local, plan)    # looked up now: a planted one reaches the ranks
    return np.asarray(window), comm.stats.bytes_sent - before


def _side(at: int, own: tuple[int, int], names: tuple[str, str]) -> str | None:
    return names[0] if at < own[0] else names[1] if at >= own[1] else None


def _where(plan: HaloPlan, rank: int, row: int, col: int) -> str:
    (own_r, own_c) = plan.own_block(rank)
    sides = [s for s in (_side(row, own_r, ("above", "below")), _side(col, own_c, ("left", "right"))) if s]
    if not sides:
        return "its own block"
    return f"the halo {'-'.join(sides)}" + (" (a corner)" if len(sides) == 2 else "")


def _owner(plan: HaloPlan, row: int, col: int) -> int:
    return next(q for q in range(plan.world_size)
                if plan.own_block(q)[0][0] <= row < plan.own_block(q)[0][1]
                and plan.own_block(q)[1][0] <= col < plan.own_block(q)[1][1])


def diagnose_halo(case) -> str | None:
    """The first rank, halo side and element exchange_halo fills wrongly, or its bytes sent."""
    hw, kernel, stride, padding, grid = case
    plan = HaloPlan.build(hw, kernel, stride, padding, grid)
    what = (f"exchange_halo, input {hw[0]}×{hw[1]}, kernel {kernel}, stride {stride}, padding {padding}, "
            f"grid {grid[0]}×{grid[1]}")
    try:
        traces = run(halo_trace, plan.world_size, case, timeout=30)
    except ClusterError as err:
        return f"{what}: the run failed: {err}"
    x = marked(hw)
    for r, (window, sent) in enumerate(traces):
        (own_r, own_c), (win_r, win_c) = plan.own_block(r), plan.window_block(r)
        want = x[:, :, win_r[0]:win_r[1], win_c[0]:win_c[1]]
        rank = f"rank {r} (grid {plan.grid_index(r)}, own rows [{own_r[0]}, {own_r[1]}) × columns " \
               f"[{own_c[0]}, {own_c[1]}))"
        if window.shape != want.shape:
            return (f"{what}: {rank}: the window should be rows [{win_r[0]}, {win_r[1]}) × columns "
                    f"[{win_c[0]}, {win_c[1]}), shape {want.shape}; it has shape {window.shape}")
        off = np.argwhere(window != want)
        if off.size:
            _, _, i, j = (int(v) for v in off[0])
            row, col, value = win_r[0] + i, win_c[0] + j, window[0, 0, i, j]
            got_r, got_c = divmod(int(value) - 1, 64)
            holds = "0: it was never filled" if value == 0 else \
                f"x[{got_r}, {got_c}] (rank {_owner(plan, got_r, got_c)}'s)" \
                if value == int(value) and 0 <= got_r < hw[0] and 0 <= got_c < hw[1] else f"{value:g}"
            return (f"{what}: {rank}: window element ({i}, {j}) is global row {row}, column {col}, in "
                    f"{_where(plan, r, row, col)}: it should hold x[{row}, {col}] (rank "
                    f"{_owner(plan, row, col)}'s); it holds {holds}")
        expected = plan.halo_bytes(r, 1, 1, x.itemsize)[0]
        if sent != expected:
            return (f"{what}: {rank} sent {sent} bytes; the halo plan sends {expected} (only the rows and "
                    f"columns another rank's window needs)")
    return None
