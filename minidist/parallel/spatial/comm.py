"""Halo exchange on the cluster: forward (fetch the neighbours' boundary rows) and backward (send the
gradient of those rows back to their owners, who add it into their interior).

Every rank takes the plan's steps (partition.py's HaloPlan: shifts, "everybody passes a slab down", then
"up") in the same order; comm.sendrecv lets a rank's send and receive progress together, so a shift never
deadlocks, whatever the message size. Backward runs the same steps in reverse with the roles swapped.
Shapes: NCHW. x_local (N, C, h, w) is the rank's own piece; the window (N, C, H_w, W_w) is the clipped
window of input rows × columns its output needs.
"""

from __future__ import annotations

import numpy as np

from .partition import HaloPlan, Range, Transfer, intersect, length

FORWARD_TAG = 101   # halo values, owner -> reader
BACKWARD_TAG = 102  # halo gradients, reader -> owner


def _slice(r: Range, origin: int) -> slice:
    """Global rows (or columns) r as a slice of a local array whose first row (column) is `origin`."""
    return slice(r[0] - origin, r[1] - origin)


def _check_piece(x: np.ndarray, expected: tuple[int, int], what: str) -> None:
    if not isinstance(x, np.ndarray) or x.ndim != 4:
        raise ValueError(f"{what}: expected an (N, C, H, W) numpy array, got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    if x.shape[2:] != expected:
        raise ValueError(f"{what}: expected spatial shape {expected} for this rank's block, "
                         f"got {x.shape[2:]}")


def _dst(t: Transfer | None) -> int | None:
    return None if t is None else t.dst


def _src(t: Transfer | None) -> int | None:
    return None if t is None else t.src


def shift_step(comm, outgoing: np.ndarray | None, dst: int | None, src: int | None, tag: int):
    """One step of a shift: send `outgoing` to dst and/or receive from src (None: no partner).
    Returns what arrived (None if nothing was to arrive)."""
    if dst is not None and src is not None:
        return comm.sendrecv(outgoing, dst, src, sendtag=tag, recvtag=tag)
    if dst is not None:
        comm.send(outgoing, dst, tag=tag)
        return None
    return comm.recv(src, tag=tag)


def exchange_halo(comm, x_local: np.ndarray, plan: HaloPlan) -> np.ndarray:
    """Return this rank's clipped input window (N, C, H_w, W_w), filled from x_local and the halos.

    Phase 0 (along H): the buffer `tall` has the window's rows and this rank's own columns; own rows
    are copied, the other rows arrive as full-width slabs from the ranks of the same grid column.
    Phase 1 (along W): the ranks of one grid row have the same row window, so each sends the others the
    columns of its `tall` buffer they need; corners (e.g. the top-left neighbour's rows) ride along.
    """
    (own_r, own_c), (win_r, win_c) = plan.own_block(comm.rank), plan.window_block(comm.rank)
    _check_piece(x_local, (length(own_r), length(own_c)), "exchange_halo (own block)")
    n, ch = x_local.shape[:2]
    # BEGIN SOLUTION halo_exchange
    # BEGIN PROMPT
    # Hint: phase 0 fills a buffer of the window's rows × your own columns: your own rows from x_local,
    # the rest from the row slabs of plan.steps(comm.rank, phase=0), one shift_step per step. Phase 1
    # fills the window from that buffer and the column slabs of plan.steps(comm.rank, phase=1), sent as
    # full-height slices of the buffer. _slice(range, origin) turns global rows/columns into local ones.
    # END PROMPT
    tall = np.zeros((n, ch, length(win_r), length(own_c)), dtype=x_local.dtype)
    kept = intersect(own_r, win_r)
    tall[:, :, _slice(kept, win_r[0])] = x_local[:, :, _slice(kept, own_r[0])]
    for send, recv in plan.steps(comm.rank, phase=0):
        slab = None if send is None else np.ascontiguousarray(x_local[:, :, _slice(send.rows, own_r[0])])
        got = shift_step(comm, slab, _dst(send), _src(recv), FORWARD_TAG)
        if recv is not None:
            tall[:, :, _slice(recv.rows, win_r[0])] = got

    window = np.zeros((n, ch, length(win_r), length(win_c)), dtype=x_local.dtype)
    kept = intersect(own_c, win_c)
    window[..., _slice(kept, win_c[0])] = tall[..., _slice(kept, own_c[0])]
    for send, recv in plan.steps(comm.rank, phase=1):
        slab = None if send is None else np.ascontiguousarray(tall[..., _slice(send.cols, own_c[0])])
        got = shift_step(comm, slab, _dst(send), _src(recv), FORWARD_TAG)
        if recv is not None:
            window[..., _slice(recv.cols, win_c[0])] = got
    # END SOLUTION
    return window


def return_halo_gradient(comm, d_window: np.ndarray, plan: HaloPlan) -> np.ndarray:
    """The transpose of exchange_halo: from the gradient of this rank's window (N, C, H_w, W_w), return
    the gradient of its own piece (N, C, h, w), after every halo gradient has been added into its owner.

    Rows the rank owns but no output reads (trimmed) get gradient 0.
    """
    (own_r, own_c), (win_r, win_c) = plan.own_block(comm.rank), plan.window_block(comm.rank)
    _check_piece(d_window, (length(win_r), length(win_c)), "return_halo_gradient (window)")
    n, ch = d_window.shape[:2]
    # Undo phase 1: the column slabs this rank received go back to their senders, who add them into
    # their tall buffer (the corner parts included, which then travel on in phase 0).
    d_tall = np.zeros((n, ch, length(win_r), length(own_c)), dtype=d_window.dtype)
    kept = intersect(own_c, win_c)
    d_tall[..., _slice(kept, own_c[0])] = d_window[..., _slice(kept, win_c[0])]
    for sent, received in reversed(plan.steps(comm.rank, phase=1)):
        slab = None if received is None else \
            np.ascontiguousarray(d_window[..., _slice(received.cols, win_c[0])])
        got = shift_step(comm, slab, _src(received), _dst(sent), BACKWARD_TAG)
        if sent is not None:
            d_tall[..., _slice(sent.cols, own_c[0])] += got
    # Undo phase 0: row slabs go back to their owners, who add them into their interior.
    dx = np.zeros((n, ch, length(own_r), length(own_c)), dtype=d_window.dtype)
    kept = intersect(own_r, win_r)
    dx[:, :, _slice(kept, own_r[0])] = d_tall[:, :, _slice(kept, win_r[0])]
    for sent, received in reversed(plan.steps(comm.rank, phase=0)):
        slab = None if received is None else \
            np.ascontiguousarray(d_tall[:, :, _slice(received.rows, win_r[0])])
        got = shift_step(comm, slab, _src(received), _dst(sent), BACKWARD_TAG)
        if sent is not None:
            dx[:, :, _slice(sent.rows, own_r[0])] += got
    return dx
